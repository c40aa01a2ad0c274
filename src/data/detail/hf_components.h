#pragma once

// The parts of a Hugging Face tokenizer.json around its model: the
// normalizer, the pre-tokenizer and the decoder, each read from its JSON
// object. Parsing throws DataError naming `where` (the file and the field,
// "tokenizer.json: pre_tokenizer.pretokenizers[1].type") for what is
// malformed or of a type cohort does not implement.

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace cohort::data::detail {

class Normalizer {
 public:
  Normalizer() = default;
  // `j` null: none.
  Normalizer(const nlohmann::json& j, const std::string& where);
  std::string apply(std::string text) const;
  bool empty() const { return steps_.empty(); }

  struct Step {
    enum Kind { prepend, replace, nfc, nfd, nfkc, nfkd, lowercase, strip, stripAccents, bert } kind;
    std::string a, b;  // prepend: a; replace: a -> b
    bool left = false, right = false;  // strip
    bool cleanText = false, chineseChars = false, accents = false, lower = false;  // bert
  };

 private:
  void add(const nlohmann::json& j, const std::string& where, int depth = 0);
  std::vector<Step> steps_;
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  PreTokenizer(const nlohmann::json& j, const std::string& where);
  // Appends the words of `text` to `out`; `atStart`: `text` begins the
  // whole input (Metaspace's prepend_scheme "first").
  void apply(const std::string& text, bool atStart, std::vector<std::string>& out) const;

  struct Step {
    enum Kind { byteLevel, metaspace, bert, whitespaceSplit, gpt2Split } kind;
    bool addPrefixSpace = false, useRegex = true;  // byteLevel
    std::string replacement;                       // metaspace
    enum Prepend { always, first, never } prepend = always;
    bool split = true;
  };

 private:
  void add(const nlohmann::json& j, const std::string& where, int depth = 0);
  std::vector<Step> steps_;
};

class Decoder {
 public:
  Decoder() = default;
  Decoder(const nlohmann::json& j, const std::string& where);
  // The text of `tokens` (bytes, exactly, where the decoder maps bytes:
  // ByteLevel and ByteFallback).
  std::string apply(std::vector<std::string> tokens) const;

  struct Step {
    enum Kind { byteLevel, metaspace, replace, byteFallback, fuse, strip, wordPiece } kind;
    std::string a, b;  // replace: a -> b; metaspace: a the replacement; strip: a the content
    bool prependFirst = true;  // metaspace: drop the first token's leading space
    size_t start = 0, stop = 0;  // strip
    bool cleanup = false;  // wordPiece (a: its prefix)
  };

 private:
  void add(const nlohmann::json& j, const std::string& where, int depth = 0);
  std::vector<Step> steps_;
  bool joinWithSpaces_ = false;  // no decoder: tokens joined by spaces
};

// How deep Sequences may nest in a file (a deeper one is refused, not
// recursed into).
inline constexpr int kMostNesting = 16;

// Reading fields: `j[key]` of the type wanted, or DataError naming
// `where.key`.
std::string stringField(const nlohmann::json& j, const char* key, const std::string& where);
bool boolField(const nlohmann::json& j, const char* key, bool otherwise, const std::string& where);

}  // namespace cohort::data::detail
