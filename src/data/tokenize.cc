// `cohort data tokenize`: text into token datasets (docs/token-format.md).

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "cohort/ckpt/manifest.h"
#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/data/tokens.h"
#include "cohort/core/time.h"
#include "data/detail/destination.h"

namespace cohort::data {

namespace fs = std::filesystem;

namespace {

// Writes one token dataset: text goes in (addText), its tokens into shard
// files of at most `shardTokens` each, `width` bytes per token; finish()
// writes the tokenizer's model, if it has one, and dataset.json.
class TokenDatasetWriter {
 public:
  static constexpr size_t kLongestLine = size_t{4} << 20;

  TokenDatasetWriter(const std::string& dst, const std::string& name, const std::string& source,
                     const TokenizeOptions& options, std::shared_ptr<const Tokenizer> tokenizer)
      : out_(dst, options.storage), shardTokens_(options.shardTokens), tokenizer_(std::move(tokenizer)) {
    m_.name = name;
    m_.encoding = "tokens";
    m_.tokenizer = tokenizer_->name();
    m_.vocabSize = tokenizer_->vocabSize();
    m_.tokenBytes = m_.vocabSize > 65536 ? 4 : 2;
    m_.source = source;
    bytewise_ = tokenizer_->name() == kByteTokenizer;
  }

  // The next `n` bytes of the text. A line is encoded once it is whole.
  void addText(const char* text, size_t n) {
    m_.textBytes += static_cast<int64_t>(n);
    if (bytewise_) {
      for (size_t i = 0; i < n; ++i) addToken(static_cast<unsigned char>(text[i]));
      return;
    }
    // Only the new bytes are searched for the last newline; a line longer
    // than kLongestLine is encoded in pieces, cut between UTF-8 characters.
    const char* nl = static_cast<const char*>(::memrchr(text, '\n', n));
    pending_.append(text, n);
    size_t upTo = nl == nullptr ? 0 : pending_.size() - n + static_cast<size_t>(nl - text) + 1;
    if (upTo == 0 && pending_.size() > kLongestLine) {
      upTo = pending_.size();
      while (upTo > 0 && (static_cast<unsigned char>(pending_[upTo - 1]) & 0xC0) == 0x80) --upTo;  // continuation bytes
      if (upTo > 0 && static_cast<unsigned char>(pending_[upTo - 1]) >= 0xC0) --upTo;               // a character's lead
    }
    if (upTo == 0) return;
    for (int64_t id : tokenizer_->encode(pending_.substr(0, upTo))) addToken(id);
    pending_.erase(0, upTo);
  }

  // Tokens written so far.
  int64_t tokens() const { return written_; }

  DatasetManifest finish() {
    if (!pending_.empty()) {
      for (int64_t id : tokenizer_->encode(pending_)) addToken(id);
      pending_.clear();
    }
    if (file_) close();
    if (!tokenizer_->model().empty()) {
      const std::string file = tokenizerModelFile(tokenizer_->name());
      const std::string path = out_.scratch(file);
      writeFileAtomic(path, tokenizer_->model());
      m_.tokenizerModel = file;
      m_.tokenizerChecksum = checksumHex(checksum(tokenizer_->model().data(), tokenizer_->model().size()));
      out_.put(file);
    }
    m_.created = utcNow();
    out_.writeManifest(datasetManifestJson(m_));
    return m_;
  }

 private:
  std::string shardName() const { return fmt::format("tokens-{:05d}.bin", m_.shards.size()); }

  void addToken(int64_t id) {
    if (!file_) open();
    for (int b = 0; b < m_.tokenBytes; ++b) buffer_.push_back(static_cast<char>((id >> (8 * b)) & 0xff));  // little-endian
    ++written_;
    if (buffer_.size() >= (1u << 20)) flushBuffer();
    if (++inShard_ == shardTokens_) close();
  }

  void open() {
    const std::string path = out_.scratch(shardName());
    file_ = std::make_unique<std::ofstream>(path, std::ios::binary | std::ios::trunc);
    if (!*file_) throw IoError(fmt::format("{}: cannot create", path));
    char header[kTokenShardHeaderBytes] = {};
    std::copy(kTokenShardMagic, kTokenShardMagic + 8, header);
    header[8] = static_cast<char>(m_.tokenBytes == 2 ? kTokenShardVersion : kTokenShardVersionWide);
    header[12] = static_cast<char>(kTokenShardHeaderBytes);
    file_->write(header, sizeof(header));
    inShard_ = 0;
  }

  void flushBuffer() {
    file_->write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
    buffer_.clear();
  }

  void close() {
    flushBuffer();
    const std::string name = shardName();
    const std::string path = out_.scratch(name);
    file_->close();
    if (!*file_) throw IoError(fmt::format("{}: write failed", path));
    file_.reset();
    ShardInfo info;
    info.name = name;
    info.records = inShard_;
    uint64_t size = 0;
    info.checksum = checksumFile(path, &size);
    info.bytes = static_cast<int64_t>(size);
    out_.put(name);
    m_.shards.push_back(std::move(info));
  }

  detail::Destination out_;
  int64_t shardTokens_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  bool bytewise_ = false;
  DatasetManifest m_;
  std::unique_ptr<std::ofstream> file_;
  std::string buffer_, pending_;
  int64_t inShard_ = 0, written_ = 0;
};

std::vector<std::string> textFiles(const std::string& src) {
  std::error_code ec;
  if (fs::is_regular_file(src, ec)) return {src};
  if (!fs::is_directory(src, ec)) throw DataError(fmt::format("{}: no such file or folder", src));
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(src, ec); !ec && it != fs::end(it); it.increment(ec)) {
    if (it->is_regular_file()) files.push_back(it->path().string());
  }
  if (ec) throw DataError(fmt::format("{}: cannot list: {}", src, ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

namespace {

// The text of SRC as one stream, read in pieces: files in sorted order, or
// what standard input held.
class TextStream {
 public:
  TextStream(const std::string& src, std::istream& in) : src_(src) {
    if (src == "-") {
      piped_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      total_ = static_cast<int64_t>(piped_.size());
    } else {
      files_ = textFiles(src);
      for (const auto& f : files_) total_ += static_cast<int64_t>(fs::file_size(f));
    }
  }
  int64_t total() const { return total_; }
  int64_t files() const { return src_ == "-" ? 1 : static_cast<int64_t>(files_.size()); }
  bool piped() const { return src_ == "-"; }

  // Calls `f(bytes, n)` with the stream's pieces in order until it returns
  // false. Throws DataError when a file changed since it was measured (the
  // split was computed for its old size).
  void read(const std::function<bool(const char*, size_t)>& f) const {
    if (src_ == "-") {
      // In pieces, as files are read: a tokenizer holds one at a time.
      for (size_t at = 0; at < piped_.size(); at += size_t{1} << 20) {
        if (!f(piped_.data() + at, std::min(piped_.size() - at, size_t{1} << 20))) return;
      }
      return;
    }
    std::vector<char> buf(1 << 20);
    int64_t seen = 0;
    for (const auto& file : files_) {
      std::ifstream is(file, std::ios::binary);
      if (!is) throw DataError(fmt::format("{}: cannot open", file));
      while (is) {
        is.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        const auto n = static_cast<size_t>(is.gcount());
        if (n == 0) break;
        if (seen + static_cast<int64_t>(n) > total_) {
          throw DataError(fmt::format("{}: changed while being tokenized", file));
        }
        seen += static_cast<int64_t>(n);
        if (!f(buf.data(), n)) return;
      }
      if (is.bad()) throw DataError(fmt::format("{}: read failed", file));
    }
    if (seen != total_) throw DataError(fmt::format("{}: changed while being tokenized", src_));
  }

 private:
  std::string src_;
  std::vector<std::string> files_;
  std::string piped_;
  int64_t total_ = 0;
};

// The most text a SentencePiece model is trained on: the trainer holds its
// sentences in memory (and samples 2 million of them).
constexpr int64_t kMaxTrainingText = int64_t{256} << 20;

std::shared_ptr<const Tokenizer> chooseTokenizer(const TokenizeOptions& o, const TextStream& text,
                                                 int64_t trainBytes) {
  if (o.custom) return o.custom;
  if (o.tokenizer == kByteTokenizer) {
    if (!o.tokenizerModel.empty()) throw UsageError("--tokenizer-model goes with --tokenizer sentencepiece");
    return byteTokenizer();
  }
  if (o.tokenizer != kSentencePieceTokenizer) {
    if (!o.tokenizerModel.empty()) throw UsageError("--tokenizer-model goes with --tokenizer sentencepiece");
    TokenizerFileOptions f;
    f.merges = o.merges;
    f.lowercase = o.lowercase;
    return loadTokenizerFile(o.tokenizer, f);
  }
  if (!o.tokenizerModel.empty()) {
    std::ifstream in(o.tokenizerModel, std::ios::binary);
    if (!in) throw DataError(fmt::format("{}: cannot read the tokenizer model", o.tokenizerModel));
    const std::string model((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return makeTokenizer(kSentencePieceTokenizer, model, o.tokenizerModel);
  }
  // Trained on the training part only: the held-out text stays unseen.
  std::string sample;
  const int64_t want = std::min(trainBytes, kMaxTrainingText);
  text.read([&](const char* p, size_t n) {
    sample.append(p, static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(n), want - static_cast<int64_t>(sample.size()))));
    return static_cast<int64_t>(sample.size()) < want;
  });
  SentencePieceTraining t;
  t.vocabSize = o.vocabSize;
  t.modelType = o.modelType;
  return makeTokenizer(kSentencePieceTokenizer, trainSentencePiece(sample, t), "the trained tokenizer");
}

}  // namespace

TokenizeResult tokenize(const std::string& src, const std::string& dst,
                        const TokenizeOptions& options, std::istream& in) {
  if (!(options.valFraction >= 0 && options.valFraction < 1)) {
    throw UsageError(fmt::format("--val-fraction: must be in [0, 1), got {}", options.valFraction));
  }
  if (options.shardTokens < 1) {
    throw UsageError(fmt::format("--shard-tokens: must be >= 1, got {}", options.shardTokens));
  }
  if (!options.custom && options.tokenizer != kByteTokenizer && options.tokenizer != kSentencePieceTokenizer) {
    std::error_code ec;
    if (!fs::exists(options.tokenizer, ec)) {
      throw UsageError(fmt::format("--tokenizer {}: expected bytes, sentencepiece or a tokenizer file (no such file)",
                                   options.tokenizer));
    }
  }
  if (!options.merges.empty() && (options.tokenizer == kByteTokenizer || options.tokenizer == kSentencePieceTokenizer)) {
    throw UsageError("--merges goes with --tokenizer vocab.json");
  }
  // The whole stream's length decides where the held-out tail starts: files
  // are measured first; standard input is read into memory.
  const TextStream text(src, in);
  const int64_t total = text.total();
  if (total == 0) {
    throw DataError(fmt::format("{}: no text to tokenize ({})", text.piped() ? "standard input" : src,
                                text.files() == 0 ? "no files" : "0 bytes"));
  }
  const int64_t valBytes = std::llround(static_cast<double>(total) * options.valFraction);
  const int64_t trainBytes = total - valBytes;
  if (trainBytes == 0) throw UsageError("--val-fraction leaves no training text");
  const auto tokenizer = chooseTokenizer(options, text, trainBytes);
  const std::string source = text.piped() ? "standard input" : fs::absolute(src).string();
  const std::string base = storage::isRemoteUrl(dst) ? dst : fs::absolute(dst).string();
  // joinUrl keeps a SAS query at the end of a blob URL.
  const std::string trainDst = storage::isRemoteUrl(dst) ? storage::joinUrl(base, "train") : base + "/train";
  const std::string valDst = storage::isRemoteUrl(dst) ? storage::joinUrl(base, "val") : base + "/val";
  TokenDatasetWriter train(trainDst, "train", source, options, tokenizer);
  std::unique_ptr<TokenDatasetWriter> val;
  if (valBytes > 0) {
    val = std::make_unique<TokenDatasetWriter>(valDst, "val", source, options, tokenizer);
  } else {
    // No validation set: one left from an earlier tokenize stops being one.
    detail::Destination stale(valDst, options.storage);
  }

  // Bytes up to `split` are training text. Tokens of a model other than
  // bytes may span several bytes: the split moves on to a line's start.
  int64_t written = 0, split = trainBytes;
  const bool atLines = tokenizer->name() != kByteTokenizer;
  const bool terminal = options.progress && ::isatty(STDERR_FILENO) != 0;
  const auto started = std::chrono::steady_clock::now();
  char before = '\n';  // the byte before this piece
  text.read([&](const char* p, size_t n) {
    size_t toTrain = static_cast<size_t>(std::clamp<int64_t>(split - written, 0, static_cast<int64_t>(n)));
    const char last = toTrain > 0 ? p[toTrain - 1] : before;
    if (atLines && toTrain < n && written + static_cast<int64_t>(toTrain) == split && last != '\n') {
      const char* nl = static_cast<const char*>(std::memchr(p + toTrain, '\n', n - toTrain));
      const size_t upTo = nl == nullptr ? n : static_cast<size_t>(nl - p) + 1;
      split += static_cast<int64_t>(upTo - toTrain);
      toTrain = upTo;
    }
    train.addText(p, toTrain);
    if (n > toTrain) val->addText(p + toTrain, n - toTrain);
    written += static_cast<int64_t>(n);
    before = p[n - 1];
    if (terminal) {
      std::cerr << fmt::format("\rtokenizing: {:.1f} of {:.1f} MB", written / 1e6, total / 1e6) << std::flush;
    }
    return true;
  });
  if (terminal) std::cerr << "\n";
  TokenizeResult r;
  r.files = text.files();
  r.train = train.finish();
  if (val) r.val = val->finish();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return r;
}

}  // namespace cohort::data
