// Hugging Face's tokenizer.json: added tokens matched whole first, then the
// normalizer, the pre-tokenizer and the model (BPE or WordPiece) on the
// text between them, as Hugging Face's library does; special tokens of a
// post-processor are not added (a dataset's text is encoded in pieces).

#include <fmt/format.h>

#include <array>
#include <nlohmann/json.hpp>
#include <optional>

#include "cohort/core/error.h"
#include "data/detail/bpe.h"
#include "data/detail/hf_components.h"
#include "data/detail/hf_tokenizer.h"
#include "data/detail/unicode.h"
#include "data/detail/wordpiece.h"

namespace cohort::data::detail {

using nlohmann::json;

namespace {

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool singleWord = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Added tokens to find in a text: the leftmost, longest there.
class AddedMatcher {
 public:
  void add(const AddedToken& t) {
    if (t.content.empty()) return;
    auto& list = byFirst_[static_cast<unsigned char>(t.content[0])];
    list.push_back(t);
    std::stable_sort(list.begin(), list.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    any_ = true;
  }

  struct Piece {
    size_t begin, end;
    int64_t id;  // -1: text
  };

  // `text` cut into text and added tokens (lstrip/rstrip take the
  // whitespace beside a token into it).
  std::vector<Piece> split(std::string_view text) const {
    std::vector<Piece> out;
    if (!any_) {
      out.push_back({0, text.size(), -1});
      return out;
    }
    size_t from = 0;
    for (size_t i = 0; i < text.size();) {
      const AddedToken* hit = nullptr;
      for (const auto& t : byFirst_[static_cast<unsigned char>(text[i])]) {
        if (text.compare(i, t.content.size(), t.content) == 0 && wordAlone(text, i, t)) {
          hit = &t;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t begin = i, end = i + hit->content.size();
      if (hit->lstrip) {
        while (begin > from) {
          size_t back = begin - 1;
          while (back > from && (static_cast<unsigned char>(text[back]) & 0xC0) == 0x80) --back;
          size_t n = 0;
          if (!isWhitespace(decodeUtf8(text, back, &n))) break;
          begin = back;
        }
      }
      if (hit->rstrip) {
        while (end < text.size()) {
          size_t n = 0;
          if (!isWhitespace(decodeUtf8(text, end, &n))) break;
          end += n;
        }
      }
      if (begin > from) out.push_back({from, begin, -1});
      out.push_back({begin, end, hit->id});
      from = i = end;
    }
    if (from < text.size()) out.push_back({from, text.size(), -1});
    return out;
  }

 private:
  // single_word: no letter, digit or '_' right before or after.
  static bool wordAlone(std::string_view text, size_t at, const AddedToken& t) {
    if (!t.singleWord) return true;
    auto wordChar = [](uint32_t cp) { return cp == '_' || isLetter(cp) || isNumber(cp); };
    if (at > 0) {
      size_t back = at - 1;
      while (back > 0 && (static_cast<unsigned char>(text[back]) & 0xC0) == 0x80) --back;
      size_t n = 0;
      if (wordChar(decodeUtf8(text, back, &n))) return false;
    }
    const size_t end = at + t.content.size();
    size_t n = 0;
    return end >= text.size() || !wordChar(decodeUtf8(text, end, &n));
  }

  std::array<std::vector<AddedToken>, 256> byFirst_;
  bool any_ = false;
};

std::unordered_map<std::string, int64_t> readVocab(const json& model, const std::string& where) {
  auto it = model.find("vocab");
  if (it == model.end() || !it->is_object()) {
    throw DataError(fmt::format("{}.vocab: expected an object of token: id", where));
  }
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(it->size());
  for (const auto& [token, id] : it->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      throw DataError(fmt::format("{}.vocab[\"{}\"]: expected an id (an integer from 0), got {}", where, token,
                                  id.dump()));
    }
    vocab.emplace(token, id.get<int64_t>());
  }
  return vocab;
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(std::string text, const std::string& origin) : model_(std::move(text)) {
    json j;
    try {
      j = json::parse(model_);
    } catch (const json::exception& e) {
      throw DataError(fmt::format("{}: not JSON: {}", origin, e.what()));
    }
    if (!j.is_object()) throw DataError(fmt::format("{}: expected a JSON object, got {}", origin, j.type_name()));
    const std::string at = origin + ": ";
    // Ids run from 0 with few gaps: one far beyond the tokens is an error,
    // not a table of billions of entries.
    for (const char* key : {"model", "added_tokens"}) {
      auto it = j.find(key);
      if (it == j.end()) continue;
      if (it->is_array()) tokens_ += it->size();
      if (it->is_object() && it->contains("vocab") && (*it)["vocab"].is_object()) tokens_ += (*it)["vocab"].size();
    }
    normalizer_ = Normalizer(j.value("normalizer", json()), at + "normalizer");
    pre_ = PreTokenizer(j.value("pre_tokenizer", json()), at + "pre_tokenizer");
    decoder_ = Decoder(j.value("decoder", json()), at + "decoder");
    readModel(j, at + "model");
    readAdded(j, at + "added_tokens");
  }

  const std::string& name() const override { return name_; }
  int64_t vocabSize() const override { return static_cast<int64_t>(idToToken_.size()); }
  const std::string& model() const override { return model_; }

  int64_t tokenId(const std::string& token) const override {
    if (auto it = added_.find(token); it != added_.end()) return it->second.id;
    const auto& vocab = bpe_ ? bpe_->vocab() : wordPiece_->vocab();
    auto it = vocab.find(token);
    return it == vocab.end() ? -1 : it->second;
  }

  std::vector<std::pair<std::string, int64_t>> specialTokens() const override {
    std::vector<std::pair<std::string, int64_t>> out;
    for (const auto& [content, t] : added_) {
      if (t.special) out.emplace_back(content, t.id);
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    return out;
  }

  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> out;
    out.reserve(text.size() / 3);
    std::vector<std::string> words;
    for (const auto& section : raw_.split(text)) {
      if (section.id >= 0) {
        out.push_back(section.id);
        continue;
      }
      const std::string normal =
          normalizer_.apply(std::string(text.data() + section.begin, section.end - section.begin));
      for (const auto& sub : normalized_.split(normal)) {
        if (sub.id >= 0) {
          out.push_back(sub.id);
          continue;
        }
        words.clear();
        pre_.apply(normal.substr(sub.begin, sub.end - sub.begin), section.begin == 0 && sub.begin == 0, words);
        for (const auto& w : words) {
          if (bpe_) {
            bpe_->encode(w, out);
          } else {
            wordPiece_->encode(w, out);
          }
        }
      }
    }
    return out;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int64_t id : ids) {
      if (id < 0 || id >= vocabSize() || !known_[static_cast<size_t>(id)]) {
        throw DataError(fmt::format("token {} is not in the tokenizer's vocabulary (0..{})", id, vocabSize() - 1));
      }
      tokens.push_back(idToToken_[static_cast<size_t>(id)]);
    }
    return decoder_.apply(std::move(tokens));
  }

 private:
  void readModel(const json& j, const std::string& where) {
    auto it = j.find("model");
    if (it == j.end() || !it->is_object()) throw DataError(fmt::format("{}: expected an object", where));
    const json& m = *it;
    const std::string type = m.contains("type") ? stringField(m, "type", where) : m.contains("merges") ? "BPE" : "";
    auto vocab = readVocab(m, where);
    for (const auto& [token, id] : vocab) setToken(id, token, where + ".vocab");
    if (type == "BPE") {
      for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        if (m.contains(affix) && !m[affix].is_null() && m[affix] != "") {
          throw DataError(fmt::format("{}.{}: {} is not implemented (only none)", where, affix, m[affix].dump()));
        }
      }
      if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"] != 0 && m["dropout"] != 0.0) {
        throw DataError(fmt::format("{}.dropout: {} is not implemented (only none)", where, m["dropout"].dump()));
      }
      auto mi = m.find("merges");
      if (mi == m.end() || !mi->is_array()) throw DataError(fmt::format("{}.merges: expected an array", where));
      std::vector<std::pair<std::string, std::string>> merges;
      merges.reserve(mi->size());
      for (size_t i = 0; i < mi->size(); ++i) {
        const json& e = (*mi)[i];
        if (e.is_string()) {
          const std::string s = e.get<std::string>();
          const size_t space = s.find(' ');
          if (space == std::string::npos || space == 0 || space + 1 >= s.size() ||
              s.find(' ', space + 1) != std::string::npos) {
            throw DataError(fmt::format("{}.merges[{}]: expected two tokens separated by a space, got {}", where, i,
                                        e.dump()));
          }
          merges.emplace_back(s.substr(0, space), s.substr(space + 1));
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
          merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
        } else {
          throw DataError(fmt::format("{}.merges[{}]: expected \"a b\" or [\"a\", \"b\"], got {}", where, i,
                                      e.dump().substr(0, 80)));
        }
      }
      BpeOptions o;
      if (m.contains("unk_token") && !m["unk_token"].is_null()) o.unkToken = stringField(m, "unk_token", where);
      o.byteFallback = boolField(m, "byte_fallback", false, where);
      o.fuseUnk = boolField(m, "fuse_unk", false, where);
      o.ignoreMerges = boolField(m, "ignore_merges", false, where);
      bpe_ = std::make_unique<BpeModel>(std::move(vocab), merges, o, where,
                                        [&](size_t i) { return fmt::format("{}.merges[{}]", where, i); });
    } else if (type == "WordPiece") {
      const std::string unk = m.contains("unk_token") ? stringField(m, "unk_token", where) : "[UNK]";
      const std::string prefix =
          m.contains("continuing_subword_prefix") ? stringField(m, "continuing_subword_prefix", where) : "##";
      size_t maxChars = 100;
      if (m.contains("max_input_chars_per_word")) {
        if (!m["max_input_chars_per_word"].is_number_unsigned()) {
          throw DataError(fmt::format("{}.max_input_chars_per_word: expected a count", where));
        }
        maxChars = m["max_input_chars_per_word"].get<size_t>();
      }
      wordPiece_ = std::make_unique<WordPieceModel>(std::move(vocab), unk, prefix, maxChars, where);
    } else {
      throw DataError(fmt::format("{}.type: '{}' is not implemented (cohort reads: BPE, WordPiece)", where, type));
    }
  }

  void readAdded(const json& j, const std::string& where) {
    auto it = j.find("added_tokens");
    if (it == j.end() || it->is_null()) return;
    if (!it->is_array()) throw DataError(fmt::format("{}: expected an array", where));
    for (size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      const std::string at = fmt::format("{}[{}]", where, i);
      if (!e.is_object()) throw DataError(fmt::format("{}: expected an object", at));
      AddedToken t;
      t.content = stringField(e, "content", at);
      auto id = e.find("id");
      if (id == e.end() || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX) {
        throw DataError(fmt::format("{}.id: expected an id (an integer from 0)", at));
      }
      t.id = id->get<int64_t>();
      t.singleWord = boolField(e, "single_word", false, at);
      t.lstrip = boolField(e, "lstrip", false, at);
      t.rstrip = boolField(e, "rstrip", false, at);
      t.normalized = boolField(e, "normalized", true, at);
      t.special = boolField(e, "special", false, at);
      setToken(t.id, t.content, at + ".id", true);
      if (t.normalized && !normalizer_.empty()) {
        AddedToken n = t;
        n.content = normalizer_.apply(t.content);
        normalized_.add(n);
      } else {
        raw_.add(t);
      }
      added_[t.content] = t;
    }
  }

  // Records `token` as id `id`'s; an added token may restate a vocabulary
  // entry's id, two tokens may not share one otherwise.
  void setToken(int64_t id, const std::string& token, const std::string& where, bool added = false) {
    const auto i = static_cast<size_t>(id);
    if (i >= 2 * tokens_ + 1024) {
      throw DataError(fmt::format("{}: id {} for '{}', far beyond the file's {} tokens", where, id, token, tokens_));
    }
    if (i >= idToToken_.size()) {
      idToToken_.resize(i + 1);
      known_.resize(i + 1, false);
    }
    if (known_[i] && idToToken_[i] != token && !added) {
      throw DataError(fmt::format("{}: id {} is both '{}' and '{}'", where, id, idToToken_[i], token));
    }
    idToToken_[i] = token;
    known_[i] = true;
  }

  std::string name_ = kHuggingFaceTokenizer, model_;
  Normalizer normalizer_;
  PreTokenizer pre_;
  Decoder decoder_;
  std::unique_ptr<BpeModel> bpe_;
  std::unique_ptr<WordPieceModel> wordPiece_;
  AddedMatcher raw_, normalized_;
  std::unordered_map<std::string, AddedToken> added_;
  std::vector<std::string> idToToken_;
  std::vector<bool> known_;
  size_t tokens_ = 0;  // in the vocabulary and the added tokens
};

}  // namespace

std::shared_ptr<const Tokenizer> makeHfTokenizer(std::string json, const std::string& origin) {
  return std::make_shared<HfTokenizer>(std::move(json), origin);
}

}  // namespace cohort::data::detail
