// kind: text_classes (data/dataset.h, openTextClasses): labelled texts,
// tokenized once as they are opened and held as token ids.

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "cohort/data/tokenizer.h"

namespace cohort::data {
namespace {

class TextClasses final : public Dataset {
 public:
  TextClasses(const DatasetConfig& config, int64_t numClasses, int64_t width)
      : path_(config.path), width_(width) {
    tokenizer_ = loadTokenizerFile(config.tokenizer);
    cls_ = special("[CLS]", config.tokenizer);
    sep_ = special("[SEP]", config.tokenizer);
    pad_ = special("[PAD]", config.tokenizer);
    if (width_ < 3) {
      throw ConfigError(fmt::format("model.block_size: a labelled text takes [CLS], [SEP] and at least one token; "
                                    "got {}",
                                    width_));
    }
    std::ifstream in(path_, std::ios::binary);
    if (!in) throw DataError(fmt::format("{}: cannot read", path_));
    std::string line;
    int64_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      const size_t tab = line.find('\t');
      if (tab == std::string::npos) {
        throw DataError(fmt::format("{}:{}: no label: each line is LABEL<TAB>TEXT (docs/data.md)", path_, number));
      }
      const std::string label = line.substr(0, tab);
      int64_t value = -1;
      const auto [end, err] = std::from_chars(label.data(), label.data() + label.size(), value);
      if (err != std::errc() || end != label.data() + label.size() || value < 0 || value >= numClasses) {
        throw DataError(fmt::format("{}:{}: label '{}' is not a class: expected an integer in [0, {}) "
                                    "(model.num_classes)",
                                    path_, number, label, numClasses));
      }
      std::vector<int64_t> ids = tokenizer_->encode(line.substr(tab + 1));
      const int64_t keep = std::min<int64_t>(static_cast<int64_t>(ids.size()), width_ - 2);
      if (static_cast<int64_t>(ids.size()) > keep) ++cut_;
      tokens_.push_back(cls_);
      tokens_.insert(tokens_.end(), ids.begin(), ids.begin() + keep);
      tokens_.push_back(sep_);
      tokens_.insert(tokens_.end(), static_cast<size_t>(width_ - 2 - keep), pad_);
      labels_.push_back(value);
      if (config.limit > 0 && static_cast<int64_t>(labels_.size()) == config.limit) break;
    }
    if (labels_.empty()) throw DataError(fmt::format("{}: no labelled texts", path_));
  }

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  SampleShape shape() const override { return {1, 1, width_}; }
  SampleKind kind() const override { return SampleKind::text; }
  int64_t vocabSize() const override { return tokenizer_->vocabSize(); }
  int64_t tokenId(const std::string& token) const override { return tokenizer_->tokenId(token); }

  int64_t read(int64_t, float*, uint64_t) const override {
    throw std::logic_error(fmt::format("read of an image from labelled texts: {}", describe()));
  }
  int64_t readText(int64_t index, int64_t* out) const override {
    std::copy_n(tokens_.begin() + index * width_, width_, out);
    return labels_[static_cast<size_t>(index)];
  }
  std::string describe() const override {
    return fmt::format("text_classes {} ({} texts of {} tokens, {} cut; tokenizer {})", path_, labels_.size(),
                       width_, cut_, tokenizer_->name());
  }

 private:
  int64_t special(const char* token, const std::string& origin) const {
    const int64_t id = tokenizer_->tokenId(token);
    if (id < 0) {
      throw DataError(fmt::format("{}: the tokenizer has no {} token; a labelled text is [CLS] text [SEP] padded with "
                                  "[PAD] (a BERT vocab.txt or tokenizer.json has them)",
                                  origin, token));
    }
    return id;
  }

  std::string path_;
  int64_t width_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t cls_ = 0, sep_ = 0, pad_ = 0;
  std::vector<int64_t> tokens_;  // width_ per text
  std::vector<int64_t> labels_;
  int64_t cut_ = 0;  // texts longer than the width
};

}  // namespace

std::shared_ptr<Dataset> openTextClasses(const DatasetConfig& config, int64_t numClasses, const OpenOptions& options) {
  return std::make_shared<TextClasses>(config, numClasses, options.tokenWindow);
}

}  // namespace cohort::data
