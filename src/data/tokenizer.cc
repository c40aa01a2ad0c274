#include "cohort/data/tokenizer.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "cohort/core/checksum.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/utf8.h"
#include "cohort/data/shard_source.h"
#include "data/detail/hf_tokenizer.h"
#include "data/detail/spm_api.h"

namespace cohort::data {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  const std::string& name() const override { return name_; }
  int64_t vocabSize() const override { return kByteVocabSize; }
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> out(text.size());
    for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string out(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= kByteVocabSize) throw DataError(fmt::format("token {} is not a byte", ids[i]));
      out[i] = static_cast<char>(ids[i]);
    }
    return out;
  }
  const std::string& model() const override { return model_; }

 private:
  std::string name_ = kByteTokenizer, model_;
};

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define COHORT_CLANG_SANITIZER 1
#endif
#endif
#ifndef COHORT_CLANG_SANITIZER
#define COHORT_CLANG_SANITIZER 0
#endif

// cohort's SentencePiece module (data/detail/spm_api.h), loaded once.
struct SpmModule {
  cohort_spm_load_fn load = nullptr;
  cohort_spm_free_fn free = nullptr;
  cohort_spm_size_fn size = nullptr;
  cohort_spm_piece_fn piece = nullptr;
  cohort_spm_encode_fn encode = nullptr;
  cohort_spm_decode_fn decode = nullptr;
  cohort_spm_train_fn train = nullptr;
};

// Unused in sanitizer builds, which never load the module (spm() says why).
[[maybe_unused]] std::string moduleFile() {
  if (auto path = env::sentencePieceLibrary()) return *path;
#ifdef COHORT_SPM_MODULE
  if (std::filesystem::exists(COHORT_SPM_MODULE)) return COHORT_SPM_MODULE;
#endif
  // Beside the program, or in ../lib from it (an installed layout).
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  for (const auto& p : {self / "libcohort_spm.so", self.parent_path() / "lib" / "libcohort_spm.so"}) {
    if (std::filesystem::exists(p, ec)) return p.string();
  }
  return "libcohort_spm.so";
}

const SpmModule& spm() {
  static SpmModule m;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || COHORT_CLANG_SANITIZER
    error = "not in a sanitizer build (its runtime refuses RTLD_DEEPBIND, which keeps SentencePiece's protobuf "
            "apart from LibTorch's)";
#else
    const std::string file = moduleFile();
    void* h = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == nullptr) {
      error = fmt::format("cannot load {} ({}); set COHORT_SPM_LIBRARY to cohort's libcohort_spm.so", file,
                          ::dlerror());
      return;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (fn == nullptr && error.empty()) error = fmt::format("{}: no {}", file, name);
    };
    sym(m.load, "cohort_spm_load");
    sym(m.free, "cohort_spm_free");
    sym(m.size, "cohort_spm_size");
    sym(m.piece, "cohort_spm_piece");
    sym(m.encode, "cohort_spm_encode");
    sym(m.decode, "cohort_spm_decode");
    sym(m.train, "cohort_spm_train");
#endif
  });
  if (!error.empty()) throw DataError("SentencePiece is not available: " + error);
  return m;
}

// An error message buffer for a call into the module.
struct ErrorText {
  char text[512] = {};
};


// SentencePiece reads UTF-8 and writes its byte pieces back as characters
// (a lone or malformed byte as U+FFFD). So that every text comes back
// exactly: lines are encoded one at a time (the model never saw a newline
// inside a piece), joined by the newline's byte piece; bytes that are not
// UTF-8 become their byte pieces here, and decode to their bytes here.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string model, const std::string& origin) : model_(std::move(model)), spm_(spm()) {
    ErrorText e;
    sp_ = spm_.load(model_.data(), model_.size(), e.text, sizeof(e.text));
    if (sp_ == nullptr) throw DataError(fmt::format("{}: not a SentencePiece model: {}", origin, e.text));
    vocab_ = spm_.size(sp_);
    for (int b = 0; b < 256; ++b) {
      const std::string piece = fmt::format("<0x{:02X}>", b);
      byteId_[b] = spm_.piece(sp_, piece.data(), piece.size());
      if (byteId_[b] >= 0) byteOf_[byteId_[b]] = static_cast<char>(b);
    }
  }
  ~SentencePieceTokenizer() override { spm_.free(sp_); }
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;
  const std::string& name() const override { return name_; }
  int64_t vocabSize() const override { return vocab_; }

  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> out;
    out.reserve(text.size() / 3);
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    size_t at = 0, run = 0;  // text[run, at) is UTF-8 not yet encoded
    auto flush = [&] {
      if (at > run) library(std::string_view(text).substr(run, at - run), out);
    };
    while (at < text.size()) {
      const size_t n = p[at] == '\n' ? 0 : utf8Length(p + at, text.size() - at);
      if (n > 0) {
        at += n;
        continue;
      }
      flush();
      if (byteId_[p[at]] >= 0) {
        out.push_back(byteId_[p[at]]);
      } else {
        library(std::string_view(text).substr(at, 1), out);  // a model without byte pieces
      }
      run = ++at;
    }
    flush();
    return out;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> all(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_) {
        throw DataError(fmt::format("token {} is not in the tokenizer's vocabulary (0..{})", ids[i], vocab_ - 1));
      }
      all[i] = static_cast<int>(ids[i]);
    }
    // Byte pieces that make whole UTF-8 characters (a newline, a character
    // no piece covers): the library decodes them, and the whole sequence in
    // one call keeps its rules for the spaces between pieces. Bytes that are
    // not UTF-8 (which only cohort's encode makes, of bytes that were not
    // UTF-8 in the text): their own bytes, the pieces around them through
    // the library.
    std::string bytes;
    bool whole = true;
    for (size_t i = 0; i <= all.size() && whole; ++i) {
      auto b = i < all.size() ? byteOf_.find(all[i]) : byteOf_.end();
      if (b != byteOf_.end()) {
        bytes += b->second;
        continue;
      }
      const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
      for (size_t at = 0; at < bytes.size() && whole;) {
        const size_t n = utf8Length(p + at, bytes.size() - at);
        whole = n > 0;
        at += n;
      }
      bytes.clear();
    }
    if (whole) return library(all);
    std::string out;
    std::vector<int> run;
    for (int id : all) {
      if (auto b = byteOf_.find(id); b != byteOf_.end()) {
        out += library(run);
        run.clear();
        out += b->second;
      } else {
        run.push_back(id);
      }
    }
    return out + library(run);
  }
  const std::string& model() const override { return model_; }
  int64_t tokenId(const std::string& token) const override {
    const int id = spm_.piece(sp_, token.data(), token.size());
    return id < 0 ? -1 : id;
  }

 private:
  std::string library(const std::vector<int>& ids) const {
    std::string out;
    if (ids.empty()) return out;
    ErrorText e;
    const auto append = [](void* ctx, const char* data, size_t n) { static_cast<std::string*>(ctx)->append(data, n); };
    if (spm_.decode(sp_, ids.data(), ids.size(), append, &out, e.text, sizeof(e.text)) != 0) {
      throw DataError(fmt::format("sentencepiece could not decode: {}", e.text));
    }
    return out;
  }

  void library(std::string_view text, std::vector<int64_t>& out) const {
    ErrorText e;
    const auto append = [](void* ctx, const int* ids, size_t n) {
      auto* v = static_cast<std::vector<int64_t>*>(ctx);
      v->insert(v->end(), ids, ids + n);
    };
    if (spm_.encode(sp_, text.data(), text.size(), append, &out, e.text, sizeof(e.text)) != 0) {
      throw DataError(fmt::format("sentencepiece could not encode: {}", e.text));
    }
  }

  std::string name_ = kSentencePieceTokenizer, model_;
  const SpmModule& spm_;
  void* sp_ = nullptr;
  int64_t vocab_ = 0;
  int byteId_[256];
  std::unordered_map<int, char> byteOf_;
};

// The text's non-empty lines, for the trainer, one at a time.
struct Lines {
  const std::string& text;
  size_t at = 0;
  static int next(void* ctx, const char** line, size_t* n) {
    auto* l = static_cast<Lines*>(ctx);
    while (l->at < l->text.size()) {
      const size_t nl = std::min(l->text.find('\n', l->at), l->text.size());
      const size_t begin = l->at;
      l->at = nl + 1;
      if (nl > begin) {
        *line = l->text.data() + begin;
        *n = nl - begin;
        return 1;
      }
    }
    return 0;
  }
};

}  // namespace

std::shared_ptr<const Tokenizer> byteTokenizer() {
  static const std::shared_ptr<const Tokenizer> bytes = std::make_shared<ByteTokenizer>();
  return bytes;
}

std::shared_ptr<const Tokenizer> makeTokenizer(const std::string& name, const std::string& model,
                                               const std::string& origin) {
  if (name == kByteTokenizer) return byteTokenizer();
  if (name == kSentencePieceTokenizer) return std::make_shared<SentencePieceTokenizer>(model, origin);
  if (name == kHuggingFaceTokenizer) return detail::makeHfTokenizer(model, origin);
  throw DataError(fmt::format("{}: tokenizer '{}' is not known to this build (it has: {}, {}, {})", origin, name,
                              kByteTokenizer, kSentencePieceTokenizer, kHuggingFaceTokenizer));
}

std::string tokenizerModelFile(const std::string& name) {
  return name == kHuggingFaceTokenizer ? kTokenizerJsonFile : kTokenizerModelFile;
}

std::shared_ptr<const Tokenizer> datasetTokenizer(const ShardSource& source) {
  const DatasetManifest& m = source.manifest();
  const std::string where = source.describe() + "/" + kDatasetManifestName;
  if (m.tokenizerModel.empty()) {
    auto t = makeTokenizer(m.tokenizer, "", where);
    if (m.vocabSize > t->vocabSize() && m.tokenizer == kByteTokenizer) {
      throw DataError(fmt::format("{}: vocab_size {} for the byte tokenizer (256 ids)", where, m.vocabSize));
    }
    return t;
  }
  const std::string file = source.describe() + "/" + m.tokenizerModel;
  const std::string model = source.readFile(m.tokenizerModel);
  const std::string sum = checksumHex(checksum(model.data(), model.size()));
  if (sum != m.tokenizerChecksum) {
    throw DataError(fmt::format("{}: checksum {}, dataset.json records {}: not the tokenizer model these tokens "
                                "were made with",
                                file, sum, m.tokenizerChecksum));
  }
  auto t = makeTokenizer(m.tokenizer, model, file);
  if (t->vocabSize() != m.vocabSize) {
    throw DataError(fmt::format("{}: a vocabulary of {} pieces, dataset.json's vocab_size is {}", file,
                                t->vocabSize(), m.vocabSize));
  }
  return t;
}

std::string trainSentencePiece(const std::string& text, const SentencePieceTraining& s) {
  if (s.modelType != "bpe" && s.modelType != "unigram") {
    throw UsageError(fmt::format("--model-type {}: expected bpe or unigram", s.modelType));
  }
  // 256 byte pieces and <unk> come first; the rest are learned.
  if (s.vocabSize < 300 || s.vocabSize > (int64_t{1} << 31) - 1) {
    throw UsageError(fmt::format("--vocab-size {}: a SentencePiece vocabulary here holds the 256 bytes and "
                                 "pieces besides: at least 300",
                                 s.vocabSize));
  }
  const unsigned threads = s.threads > 0 ? static_cast<unsigned>(s.threads) : std::max(1u, std::thread::hardware_concurrency());
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", s.modelType},
      {"vocab_size", std::to_string(s.vocabSize)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "false"},
      {"max_sentence_length", "65536"},
      {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"minloglevel", "2"},
  };
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : args) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  Lines lines{text};
  std::string model;
  ErrorText e;
  const auto keep = [](void* ctx, const char* data, size_t n) { static_cast<std::string*>(ctx)->assign(data, n); };
  if (spm().train(keys.data(), values.data(), keys.size(), &Lines::next, &lines, keep, &model, e.text,
                  sizeof(e.text)) != 0) {
    throw DataError(fmt::format("sentencepiece could not train a vocabulary of {} ({}): {}", s.vocabSize,
                                s.modelType, e.text));
  }
  return model;
}

}  // namespace cohort::data
