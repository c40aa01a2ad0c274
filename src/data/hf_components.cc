#include "data/detail/hf_components.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cohort/core/error.h"
#include "data/detail/pre_tokenizer.h"
#include "data/detail/unicode.h"

namespace cohort::data::detail {

using nlohmann::json;

std::string stringField(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    throw DataError(fmt::format("{}.{}: expected a string, {}", where, key,
                                it == j.end() ? "it is missing" : std::string("got ") + it->type_name()));
  }
  return it->get<std::string>();
}

bool boolField(const json& j, const char* key, bool otherwise, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return otherwise;
  if (!it->is_boolean()) throw DataError(fmt::format("{}.{}: expected true or false, got {}", where, key, it->dump()));
  return it->get<bool>();
}

namespace {

size_t sizeField(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) {
    throw DataError(fmt::format("{}.{}: expected a count (0 or more)", where, key));
  }
  return it->get<size_t>();
}

// The type of component `j`, which must be an object with a "type".
std::string typeOf(const json& j, const std::string& where) {
  if (!j.is_object()) throw DataError(fmt::format("{}: expected an object, got {}", where, j.type_name()));
  return stringField(j, "type", where);
}

// A Replace's pattern: {"String": "..."} (a regular expression is not
// implemented).
std::string literalPattern(const json& j, const std::string& where) {
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object()) throw DataError(fmt::format("{}.pattern: expected an object", where));
  if (it->contains("String")) return stringField(*it, "String", where + ".pattern");
  throw DataError(fmt::format("{}.pattern: only a {{\"String\": ...}} pattern is implemented, got {}", where,
                              it->dump()));
}

[[noreturn]] void unsupported(const std::string& where, const std::string& type, const char* known) {
  throw DataError(fmt::format("{}.type: '{}' is not implemented (cohort reads: {})", where, type, known));
}

void replaceAll(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t at = 0;
  for (size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, at)) {
    out.append(s, at, hit - at).append(to);
    at = hit + from.size();
  }
  if (at == 0) return;
  s = out.append(s, at, std::string::npos);
}

std::string bertNormalize(const std::string& s, const Normalizer::Step& step) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = 0;
    const uint32_t cp = decodeUtf8(s, i, &n);
    if (step.cleanText && (cp == 0 || cp == 0xFFFD || (cp != '\t' && cp != '\n' && cp != '\r' && isOther(cp)))) {
      // dropped
    } else if (step.cleanText && isWhitespace(cp)) {
      out += ' ';
    } else if (step.chineseChars && isCjkIdeograph(cp)) {
      out += ' ';
      out.append(s, i, n);
      out += ' ';
    } else {
      out.append(s, i, n);
    }
    i += n;
  }
  if (step.accents) {
    out = normalize(out, NormalForm::nfd);
    std::string kept;
    kept.reserve(out.size());
    for (size_t i = 0; i < out.size();) {
      size_t n = 0;
      if (!isNonspacingMark(decodeUtf8(out, i, &n))) kept.append(out, i, n);
      i += n;
    }
    out = std::move(kept);
  }
  if (step.lower) out = lowercase(out);
  return out;
}

}  // namespace

Normalizer::Normalizer(const json& j, const std::string& where) {
  if (!j.is_null()) add(j, where);
}

void Normalizer::add(const json& j, const std::string& where, int depth) {
  const std::string type = typeOf(j, where);
  Step s{};
  if (type == "Sequence") {
    if (depth >= kMostNesting) throw DataError(fmt::format("{}: Sequences nested deeper than {}", where, kMostNesting));
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) throw DataError(fmt::format("{}.normalizers: expected an array", where));
    for (size_t i = 0; i < it->size(); ++i) add((*it)[i], fmt::format("{}.normalizers[{}]", where, i), depth + 1);
    return;
  } else if (type == "Prepend") {
    s.kind = Step::prepend;
    s.a = stringField(j, "prepend", where);
  } else if (type == "Replace") {
    s.kind = Step::replace;
    s.a = literalPattern(j, where);
    s.b = stringField(j, "content", where);
  } else if (type == "NFC") {
    s.kind = Step::nfc;
  } else if (type == "NFD") {
    s.kind = Step::nfd;
  } else if (type == "NFKC") {
    s.kind = Step::nfkc;
  } else if (type == "NFKD") {
    s.kind = Step::nfkd;
  } else if (type == "Lowercase") {
    s.kind = Step::lowercase;
  } else if (type == "StripAccents") {
    s.kind = Step::stripAccents;
  } else if (type == "Strip") {
    s.kind = Step::strip;
    s.left = boolField(j, "strip_left", true, where);
    s.right = boolField(j, "strip_right", true, where);
  } else if (type == "BertNormalizer") {
    s.kind = Step::bert;
    s.cleanText = boolField(j, "clean_text", true, where);
    s.chineseChars = boolField(j, "handle_chinese_chars", true, where);
    s.lower = boolField(j, "lowercase", true, where);
    s.accents = boolField(j, "strip_accents", s.lower, where);
  } else {
    unsupported(where, type, "Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, "
                             "BertNormalizer");
  }
  steps_.push_back(std::move(s));
}

std::string Normalizer::apply(std::string text) const {
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Step::prepend:
        if (!text.empty()) text.insert(0, s.a);
        break;
      case Step::replace: replaceAll(text, s.a, s.b); break;
      case Step::nfc: text = normalize(text, NormalForm::nfc); break;
      case Step::nfd: text = normalize(text, NormalForm::nfd); break;
      case Step::nfkc: text = normalize(text, NormalForm::nfkc); break;
      case Step::nfkd: text = normalize(text, NormalForm::nfkd); break;
      case Step::lowercase: text = lowercase(text); break;
      case Step::stripAccents: {
        std::string kept;
        for (size_t i = 0; i < text.size();) {
          size_t n = 0;
          if (!isNonspacingMark(decodeUtf8(text, i, &n))) kept.append(text, i, n);
          i += n;
        }
        text = std::move(kept);
        break;
      }
      case Step::strip: {
        size_t begin = 0, end = text.size();
        while (s.left && begin < end) {
          size_t n = 0;
          if (!isWhitespace(decodeUtf8(text, begin, &n))) break;
          begin += n;
        }
        while (s.right && end > begin) {
          size_t back = end - 1;
          while (back > begin && (static_cast<unsigned char>(text[back]) & 0xC0) == 0x80) --back;
          size_t n = 0;
          if (!isWhitespace(decodeUtf8(text, back, &n)) || back + n != end) break;
          end = back;
        }
        text = text.substr(begin, end - begin);
        break;
      }
      case Step::bert: text = bertNormalize(text, s); break;
    }
  }
  return text;
}

PreTokenizer::PreTokenizer(const json& j, const std::string& where) {
  if (!j.is_null()) add(j, where);
}

void PreTokenizer::add(const json& j, const std::string& where, int depth) {
  const std::string type = typeOf(j, where);
  Step s{};
  if (type == "Sequence") {
    if (depth >= kMostNesting) throw DataError(fmt::format("{}: Sequences nested deeper than {}", where, kMostNesting));
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) throw DataError(fmt::format("{}.pretokenizers: expected an array", where));
    for (size_t i = 0; i < it->size(); ++i) add((*it)[i], fmt::format("{}.pretokenizers[{}]", where, i), depth + 1);
    return;
  } else if (type == "ByteLevel") {
    s.kind = Step::byteLevel;
    s.addPrefixSpace = boolField(j, "add_prefix_space", true, where);
    s.useRegex = boolField(j, "use_regex", true, where);
  } else if (type == "Metaspace") {
    s.kind = Step::metaspace;
    s.replacement = j.contains("replacement") ? stringField(j, "replacement", where) : "\xE2\x96\x81";
    s.split = boolField(j, "split", true, where);
    if (j.contains("prepend_scheme")) {
      const std::string p = stringField(j, "prepend_scheme", where);
      if (p == "always") {
        s.prepend = Step::always;
      } else if (p == "first") {
        s.prepend = Step::first;
      } else if (p == "never") {
        s.prepend = Step::never;
      } else {
        throw DataError(fmt::format("{}.prepend_scheme: '{}', expected always, first or never", where, p));
      }
    } else {
      s.prepend = boolField(j, "add_prefix_space", true, where) ? Step::always : Step::never;
    }
  } else if (type == "BertPreTokenizer") {
    s.kind = Step::bert;
  } else if (type == "WhitespaceSplit") {
    s.kind = Step::whitespaceSplit;
  } else if (type == "Split") {
    // GPT-2's pattern, isolated: what GPT-style files that spell out the
    // split use. Other patterns need a regular-expression engine.
    auto p = j.find("pattern");
    const bool gpt2 = p != j.end() && p->is_object() && p->contains("Regex") && (*p)["Regex"] == kGpt2Pattern;
    if (!gpt2 || j.value("behavior", "") != "Isolated" || boolField(j, "invert", false, where)) {
      throw DataError(fmt::format("{}: a Split is implemented for GPT-2's pattern, isolated, not inverted; got {}",
                                  where, j.dump().substr(0, 200)));
    }
    s.kind = Step::gpt2Split;
  } else {
    unsupported(where, type, "Sequence, ByteLevel, Metaspace, BertPreTokenizer, WhitespaceSplit, Split (GPT-2's)");
  }
  steps_.push_back(std::move(s));
}

void PreTokenizer::apply(const std::string& text, bool atStart, std::vector<std::string>& out) const {
  if (steps_.empty()) {
    out.push_back(text);
    return;
  }
  std::vector<std::string> words{text}, next;
  for (const Step& s : steps_) {
    next.clear();
    for (size_t w = 0; w < words.size(); ++w) {
      std::string& word = words[w];
      switch (s.kind) {
        case Step::byteLevel: {
          if (s.addPrefixSpace && !word.empty() && word.front() != ' ') word.insert(0, " ");
          const size_t from = next.size();
          if (s.useRegex) {
            splitGpt2(word, next);
          } else {
            next.push_back(word);
          }
          for (size_t i = from; i < next.size(); ++i) next[i] = bytesToByteLevel(next[i]);
          break;
        }
        case Step::metaspace: {
          replaceAll(word, " ", s.replacement);
          const bool prepend = s.prepend == Step::always || (s.prepend == Step::first && atStart && w == 0);
          if (prepend && word.compare(0, s.replacement.size(), s.replacement) != 0) word.insert(0, s.replacement);
          if (s.split) {
            splitBefore(word, s.replacement, next);
          } else {
            next.push_back(word);
          }
          break;
        }
        case Step::bert: splitBert(word, next); break;
        case Step::whitespaceSplit: splitWhitespace(word, next); break;
        case Step::gpt2Split: splitGpt2(word, next); break;
      }
    }
    words.swap(next);
  }
  for (auto& w : words) out.push_back(std::move(w));
}

Decoder::Decoder(const json& j, const std::string& where) {
  if (j.is_null()) {
    joinWithSpaces_ = true;
    return;
  }
  add(j, where);
}

void Decoder::add(const json& j, const std::string& where, int depth) {
  const std::string type = typeOf(j, where);
  Step s{};
  if (type == "Sequence") {
    if (depth >= kMostNesting) throw DataError(fmt::format("{}: Sequences nested deeper than {}", where, kMostNesting));
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) throw DataError(fmt::format("{}.decoders: expected an array", where));
    for (size_t i = 0; i < it->size(); ++i) add((*it)[i], fmt::format("{}.decoders[{}]", where, i), depth + 1);
    return;
  } else if (type == "ByteLevel") {
    s.kind = Step::byteLevel;
  } else if (type == "Metaspace") {
    s.kind = Step::metaspace;
    s.a = j.contains("replacement") ? stringField(j, "replacement", where) : "\xE2\x96\x81";
    s.prependFirst = j.contains("prepend_scheme") ? stringField(j, "prepend_scheme", where) != "never"
                                                  : boolField(j, "add_prefix_space", true, where);
  } else if (type == "Replace") {
    s.kind = Step::replace;
    s.a = literalPattern(j, where);
    s.b = stringField(j, "content", where);
  } else if (type == "ByteFallback") {
    s.kind = Step::byteFallback;
  } else if (type == "Fuse") {
    s.kind = Step::fuse;
  } else if (type == "Strip") {
    s.kind = Step::strip;
    s.a = stringField(j, "content", where);
    s.start = sizeField(j, "start", where);
    s.stop = sizeField(j, "stop", where);
  } else if (type == "WordPiece") {
    s.kind = Step::wordPiece;
    s.a = j.contains("prefix") ? stringField(j, "prefix", where) : "##";
    s.cleanup = boolField(j, "cleanup", true, where);
  } else {
    unsupported(where, type, "Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, WordPiece");
  }
  steps_.push_back(std::move(s));
}

namespace {

// <0xNN> as its byte, or -1.
int byteToken(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = t[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

std::string wordPieceCleanup(std::string s) {
  for (const auto& [from, to] : std::initializer_list<std::pair<const char*, const char*>>{
           {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
           {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}}) {
    replaceAll(s, from, to);
  }
  return s;
}

// Drops up to `n` `content` characters from the start (or the end) of `t`.
void stripContent(std::string& t, const std::string& content, size_t start, size_t stop) {
  for (size_t i = 0; i < start && !content.empty() && t.compare(0, content.size(), content) == 0; ++i) {
    t.erase(0, content.size());
  }
  for (size_t i = 0; i < stop && !content.empty() && t.size() >= content.size() &&
                     t.compare(t.size() - content.size(), content.size(), content) == 0;
       ++i) {
    t.erase(t.size() - content.size());
  }
}

}  // namespace

std::string Decoder::apply(std::vector<std::string> tokens) const {
  if (joinWithSpaces_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i > 0 ? " " : "") + tokens[i];
    return out;
  }
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Step::byteLevel: {
        std::string all;
        for (const auto& t : tokens) all += byteLevelToBytes(t);
        tokens.assign(1, std::move(all));
        break;
      }
      case Step::metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          replaceAll(tokens[i], s.a, " ");
          if (i == 0 && s.prependFirst && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
        }
        break;
      case Step::replace:
        for (auto& t : tokens) replaceAll(t, s.a, s.b);
        break;
      case Step::byteFallback: {
        // A run of byte tokens as its bytes: UTF-8 or not, the text's own.
        std::vector<std::string> out;
        bool inBytes = false;
        for (auto& t : tokens) {
          const int b = byteToken(t);
          if (b >= 0) {
            if (!inBytes) out.emplace_back();
            out.back() += static_cast<char>(b);
            inBytes = true;
          } else {
            out.push_back(std::move(t));
            inBytes = false;
          }
        }
        tokens.swap(out);
        break;
      }
      case Step::fuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case Step::strip:
        for (auto& t : tokens) stripContent(t, s.a, s.start, s.stop);
        break;
      case Step::wordPiece:
        for (size_t i = 0; i < tokens.size(); ++i) {
          if (i != 0) {
            if (tokens[i].compare(0, s.a.size(), s.a) == 0) {
              tokens[i].erase(0, s.a.size());
            } else {
              tokens[i].insert(0, " ");
            }
          }
          if (s.cleanup) tokens[i] = wordPieceCleanup(std::move(tokens[i]));
        }
        break;
    }
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace cohort::data::detail
