// Tokenizers as users have them on disk (data/tokenizer.h): a tokenizer.json,
// GPT-2's vocab.json + merges.txt, BERT's vocab.txt, a SentencePiece model;
// the GPT-2 and BERT files become the tokenizer.json they are equivalent to,
// which is what a dataset stores.

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "cohort/core/error.h"
#include "cohort/data/tokenizer.h"
#include "data/detail/hf_tokenizer.h"
#include "data/detail/unicode.h"

namespace cohort::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace detail {

std::string gpt2TokenizerJson(const std::string& vocabText, const std::string& vocabOrigin,
                              const std::string& mergesText, const std::string& mergesOrigin) {
  json vocab;
  try {
    vocab = json::parse(vocabText);
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not JSON: {}", vocabOrigin, e.what()));
  }
  if (!vocab.is_object() || vocab.empty()) {
    throw DataError(fmt::format("{}: expected an object of token: id, got {}", vocabOrigin,
                                vocab.is_object() ? "an empty one" : vocab.type_name()));
  }
  std::unordered_map<int64_t, std::string> ids;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      throw DataError(fmt::format("{}: token \"{}\": expected an id (an integer from 0), got {}", vocabOrigin, token,
                                  id.dump()));
    }
    auto [it, fresh] = ids.emplace(id.get<int64_t>(), token);
    if (!fresh) {
      throw DataError(fmt::format("{}: token \"{}\": id {} is \"{}\"'s too", vocabOrigin, token, id.dump(), it->second));
    }
  }
  json merges = json::array();
  size_t line = 0;
  for (size_t at = 0; at < mergesText.size();) {
    const size_t nl = std::min(mergesText.find('\n', at), mergesText.size());
    std::string_view l(mergesText.data() + at, nl - at);
    at = nl + 1;
    ++line;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l.empty() || (line == 1 && l.rfind("#version", 0) == 0)) continue;
    const size_t space = l.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 >= l.size() ||
        l.find(' ', space + 1) != std::string_view::npos) {
      throw DataError(fmt::format("{}:{}: expected two tokens separated by one space, got \"{}\"", mergesOrigin, line,
                                  std::string(l.substr(0, 80))));
    }
    const std::string a(l.substr(0, space)), b(l.substr(space + 1));
    if (!detail::isUtf8(a) || !detail::isUtf8(b)) {
      throw DataError(fmt::format("{}:{}: not UTF-8", mergesOrigin, line));
    }
    for (const std::string& t : {a, b, a + b}) {
      if (!vocab.contains(t)) {
        throw DataError(fmt::format("{}:{}: \"{} {}\": \"{}\" is not in {}", mergesOrigin, line, a, b, t, vocabOrigin));
      }
    }
    merges.push_back(a + " " + b);
  }
  json added = json::array();
  if (vocab.contains("<|endoftext|>")) {
    added.push_back({{"id", vocab["<|endoftext|>"]},
                     {"content", "<|endoftext|>"},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", true},
                     {"special", true}});
  }
  const json byteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", byteLevel},
            {"post_processor", byteLevel},
            {"decoder", byteLevel},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", ""},
              {"end_of_word_suffix", ""},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"vocab", std::move(vocab)},
              {"merges", std::move(merges)}}}};
  return j.dump();
}

std::string wordPieceTokenizerJson(const std::string& text, const std::string& origin, bool lowercase) {
  json vocab = json::object();
  int64_t id = 0;
  size_t line = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = std::min(text.find('\n', at), text.size());
    std::string token = text.substr(at, nl - at);
    at = nl + 1;
    ++line;
    if (!token.empty() && token.back() == '\r') token.pop_back();
    if (!detail::isUtf8(token)) throw DataError(fmt::format("{}:{}: not UTF-8", origin, line));
    if (token.empty()) throw DataError(fmt::format("{}:{}: an empty token", origin, line));
    if (vocab.contains(token)) {
      throw DataError(fmt::format("{}:{}: \"{}\" again (first as id {})", origin, line, token, vocab[token].dump()));
    }
    vocab[token] = id++;
  }
  if (!vocab.contains("[UNK]")) throw DataError(fmt::format("{}: no [UNK] token", origin));
  json added = json::array();
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    if (!vocab.contains(t)) continue;
    added.push_back({{"id", vocab[t]},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  std::sort(added.begin(), added.end(), [](const json& a, const json& b) { return a["id"] < b["id"]; });
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer",
             {{"type", "BertNormalizer"},
              {"clean_text", true},
              {"handle_chinese_chars", true},
              {"strip_accents", nullptr},
              {"lowercase", lowercase}}},
            {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
            {"post_processor", nullptr},
            {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
            {"model",
             {{"type", "WordPiece"},
              {"unk_token", "[UNK]"},
              {"continuing_subword_prefix", "##"},
              {"max_input_chars_per_word", 100},
              {"vocab", std::move(vocab)}}}};
  return j.dump();
}

}  // namespace detail

namespace {

std::string readWhole(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot read the {}", path, what));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw DataError(fmt::format("{}: read failed", path));
  return s;
}

bool endsWith(const std::string& s, const char* tail) {
  const std::string t(tail);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// GPT-2's merges beside its vocab.json (merges.txt, or vocab.bpe beside encoder.json).
std::string mergesBeside(const std::string& vocab) {
  const fs::path dir = fs::path(vocab).parent_path();
  for (const char* name : {"merges.txt", "vocab.bpe"}) {
    std::error_code ec;
    const fs::path p = dir / name;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  throw DataError(fmt::format("{}: a vocab.json of GPT-2 needs its merges: no merges.txt or vocab.bpe beside it "
                              "(give one with --merges)",
                              vocab));
}

}  // namespace

std::shared_ptr<const Tokenizer> loadTokenizerFile(const std::string& path, const TokenizerFileOptions& options) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return loadTokenizerDirectory(path, options);
  const std::string text = readWhole(path, "tokenizer");
  const std::string name = fs::path(path).filename().string();
  if (endsWith(name, ".model")) return makeTokenizer(kSentencePieceTokenizer, text, path);
  if (endsWith(name, ".txt") && name.find("merges") == std::string::npos) {
    return makeTokenizer(kHuggingFaceTokenizer, detail::wordPieceTokenizerJson(text, path, options.lowercase), path);
  }
  // GPT-2's vocab.json by its names, by --merges, or by its content: an
  // object of token: id ("model" may be a token), where a tokenizer.json
  // has a "model" object.
  bool isVocab = name == "vocab.json" || name == "encoder.json" || !options.merges.empty();
  size_t first = 0;
  while (first < text.size() && std::isspace(static_cast<unsigned char>(text[first]))) ++first;
  if (!isVocab && (first == text.size() || text[first] != '{')) {
    throw DataError(fmt::format("{}: not a tokenizer cohort reads (a tokenizer.json, GPT-2's vocab.json with "
                                "merges.txt, BERT's vocab.txt, a SentencePiece .model)",
                                path));
  }
  if (!isVocab) {
    try {
      const json j = json::parse(text);
      isVocab = j.is_object() && !j.empty() && !(j.contains("model") && j["model"].is_object()) &&
                std::all_of(j.begin(), j.end(), [](const json& v) { return v.is_number(); });
    } catch (const json::exception&) {
      // Reported as the tokenizer.json's error, below.
    }
  }
  if (isVocab) {
    const std::string merges = options.merges.empty() ? mergesBeside(path) : options.merges;
    return makeTokenizer(kHuggingFaceTokenizer,
                         detail::gpt2TokenizerJson(text, path, readWhole(merges, "merges"), merges), path);
  }
  return makeTokenizer(kHuggingFaceTokenizer, text, path);
}

std::shared_ptr<const Tokenizer> loadTokenizerDirectory(const std::string& dir, const TokenizerFileOptions& options) {
  const fs::path d(dir);
  std::error_code ec;
  auto has = [&](const char* name) { return fs::is_regular_file(d / name, ec); };
  if (has("tokenizer.json")) return loadTokenizerFile((d / "tokenizer.json").string(), options);
  if (has("vocab.json")) return loadTokenizerFile((d / "vocab.json").string(), options);
  if (has("vocab.txt")) {
    TokenizerFileOptions o = options;
    // bert-base-cased says so in its tokenizer_config.json.
    if (has("tokenizer_config.json")) {
      try {
        const json c = json::parse(readWhole((d / "tokenizer_config.json").string(), "tokenizer config"));
        if (c.is_object() && c.contains("do_lower_case") && c["do_lower_case"].is_boolean()) {
          o.lowercase = c["do_lower_case"].get<bool>();
        }
      } catch (const json::exception& e) {
        throw DataError(fmt::format("{}: not JSON: {}", (d / "tokenizer_config.json").string(), e.what()));
      }
    }
    return loadTokenizerFile((d / "vocab.txt").string(), o);
  }
  if (has("tokenizer.model")) return loadTokenizerFile((d / "tokenizer.model").string(), options);
  throw DataError(fmt::format("{}: no tokenizer.json, vocab.json (with merges.txt), vocab.txt or tokenizer.model",
                              dir));
}

}  // namespace cohort::data
