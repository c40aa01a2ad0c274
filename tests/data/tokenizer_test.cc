// Tokenizers of token datasets (data/tokenizer.h): a SentencePiece model
// trained by `cohort data tokenize` on Debian's King James Bible gives back
// every byte of the text, is the model Python's sentencepiece reads, and
// travels with the dataset, checked; ids above uint16; bad settings and a
// model that is not the dataset's.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "cohort/data/shard_source.h"
#include "cohort/data/tokens.h"
#include "test_paths.h"
#include "util/errors.h"
#include "util/process.h"
#include "util/python.h"

namespace cohort::data {
namespace {

namespace fs = std::filesystem;

// Genesis and Exodus as `bible` prints them: 400 KB of English.
const std::string& kjv() {
  static const std::string text = [] {
    const auto r = test::run({"/usr/bin/bible", "-l80", "Gen1:1-Exo40:38"});
    EXPECT_EQ(r.exitCode, 0) << r.describe() << " (bible-kjv: scripts/install-deps.sh)";
    return r.out;
  }();
  return text;
}

TokenizeOptions sentencePiece(int64_t vocab, const std::string& type = "bpe") {
  TokenizeOptions o;
  o.tokenizer = kSentencePieceTokenizer;
  o.vocabSize = vocab;
  o.modelType = type;
  o.progress = false;
  return o;
}

std::shared_ptr<Dataset> open(const std::string& path) {
  DatasetConfig c;
  c.kind = DataKind::tokens;
  c.path = path;
  OpenOptions o;
  o.tokenWindow = 2;
  o.cache.enabled = false;
  return openTokens(c, o);
}

// Every token of a dataset, in order.
std::vector<int64_t> allTokens(const std::string& path) {
  const auto d = open(path);
  // Windows of 2 overlap by one: token i is window i's first.
  std::vector<int64_t> out;
  std::vector<int64_t> w(2);
  for (int64_t i = 0; i < d->size(); ++i) {
    d->readTokens(i, w.data(), 0);
    out.push_back(w[0]);
  }
  out.push_back(w[1]);
  return out;
}

std::shared_ptr<const Tokenizer> tokenizerOf(const std::string& path) {
  CacheConfig none;
  none.enabled = false;
  ShardSource source(path, {}, none);
  return datasetTokenizer(source);
}

TEST(SentencePiece, TrainedOnTheTextItGivesBackEveryByteAndTravelsWithTheDataset) {
  test::TempDir dir;
  std::istringstream in(kjv());
  const TokenizeResult r = tokenize("-", dir.file("kjv"), sentencePiece(2000), in);
  EXPECT_EQ(r.train.tokenizer, "sentencepiece");
  EXPECT_EQ(r.train.vocabSize, 2000);
  EXPECT_EQ(r.train.tokenBytes, 2);
  EXPECT_EQ(r.train.tokenizerModel, "tokenizer.model");
  EXPECT_EQ(r.train.textBytes + r.val.textBytes, static_cast<int64_t>(kjv().size()));
  EXPECT_TRUE(fs::is_regular_file(dir.file("kjv/train/tokenizer.model")));
  EXPECT_TRUE(fs::is_regular_file(dir.file("kjv/val/tokenizer.model")));
  // Pieces of several bytes: far fewer tokens than bytes.
  const double bytesPerToken = double(r.train.textBytes) / double(r.train.records());
  EXPECT_GT(bytesPerToken, 2.5);
  RecordProperty("bytes_per_token", std::to_string(bytesPerToken));
  EXPECT_NEAR(open(dir.file("kjv/train"))->bytesPerToken(), bytesPerToken, 1e-12);
  // The held-out text starts at a line; both parts decode to the text.
  const auto tok = tokenizerOf(dir.file("kjv/train"));
  const std::string train = tok->decode(allTokens(dir.file("kjv/train")));
  const std::string val = tokenizerOf(dir.file("kjv/val"))->decode(allTokens(dir.file("kjv/val")));
  EXPECT_EQ(train.size(), static_cast<size_t>(r.train.textBytes));
  EXPECT_EQ(train.back(), '\n');
  EXPECT_TRUE(train + val == kjv()) << "the tokens do not decode to the text";
  // Anything decodes back: bytes the model never saw, a lone newline, spaces.
  const std::string odd("  Gr\xc3\xbc\xc3\x9f\n\n\tZ\xff\x01 end  ", 22);
  EXPECT_EQ(tok->decode(tok->encode(odd)), odd);

  // The file is a SentencePiece model as Python's sentencepiece reads it,
  // and it makes the same ids of a line.
  ASSERT_TRUE(test::pythonImports("sentencepiece"));
  const std::string line = "And God said, Let there be light: and there was light.";
  std::string ids;
  for (int64_t id : tok->encode(line)) ids += std::to_string(id) + " ";
  const auto py = test::run({COHORT_PYTHON, "-c",
                             "import sys, sentencepiece as s\n"
                             "p = s.SentencePieceProcessor(model_file=sys.argv[1])\n"
                             "print(p.get_piece_size(), ' '.join(map(str, p.encode(sys.argv[2]))))",
                             dir.file("kjv/train/tokenizer.model"), line});
  ASSERT_EQ(py.exitCode, 0) << py.describe();
  EXPECT_EQ(py.out, "2000 " + ids.substr(0, ids.size() - 1) + "\n");
}

TEST(SentencePiece, AGivenModelIsUsedAsItIsAndAnotherModelIsRefused) {
  test::TempDir dir;
  std::istringstream in(kjv());
  tokenize("-", dir.file("a"), sentencePiece(1000, "unigram"), in);
  TokenizeOptions given = sentencePiece(0);
  given.tokenizerModel = dir.file("a/train/tokenizer.model");
  std::istringstream again(kjv().substr(0, 50'000));
  const TokenizeResult r = tokenize("-", dir.file("b"), given, again);
  EXPECT_EQ(r.train.vocabSize, 1000);
  EXPECT_EQ(test::readText(dir.file("b/train/tokenizer.model")), test::readText(dir.file("a/train/tokenizer.model")));

  // Another model in place of the dataset's: refused where the tokens are
  // read and where they are decoded, naming the file.
  std::istringstream third(kjv().substr(0, 80'000));
  tokenize("-", dir.file("c"), sentencePiece(600), third);
  fs::copy_file(dir.file("c/train/tokenizer.model"), dir.file("b/train/tokenizer.model"),
                fs::copy_options::overwrite_existing);
  for (const std::string& e : {test::errorOf<DataError>([&] { open(dir.file("b/train")); }),
                               test::errorOf<DataError>([&] { tokenizerOf(dir.file("b/train")); })}) {
    EXPECT_NE(e.find("b/train/tokenizer.model: checksum"), std::string::npos) << e;
    EXPECT_NE(e.find("not the tokenizer model these tokens were made with"), std::string::npos) << e;
  }
  fs::remove(dir.file("b/train/tokenizer.model"));
  EXPECT_NE(test::errorOf<DataError>([&] { open(dir.file("b/train")); }).find("tokenizer.model: missing"),
            std::string::npos);
}

TEST(SentencePiece, BadSettingsAndFilesAreNamed) {
  test::TempDir dir;
  auto run = [&](TokenizeOptions o) {
    return [&dir, o] {
      std::istringstream in(kjv().substr(0, 20'000));
      tokenize("-", dir.file("x"), o, in);
    };
  };
  EXPECT_NE(test::errorOf<UsageError>(run(sentencePiece(100))).find("--vocab-size 100"), std::string::npos);
  EXPECT_NE(test::errorOf<UsageError>(run(sentencePiece(1000, "word2vec"))).find("--model-type word2vec"),
            std::string::npos);
  TokenizeOptions bytesWithModel;
  bytesWithModel.tokenizerModel = "m.model";
  EXPECT_NE(test::errorOf<UsageError>(run(bytesWithModel)).find("--tokenizer-model goes with"), std::string::npos);
  TokenizeOptions missing = sentencePiece(0);
  missing.tokenizerModel = dir.file("none.model");
  EXPECT_NE(test::errorOf<DataError>(run(missing)).find("none.model: cannot read"), std::string::npos);
  test::writeText(dir.file("junk.model"), "not a model");
  TokenizeOptions junk = sentencePiece(0);
  junk.tokenizerModel = dir.file("junk.model");
  EXPECT_NE(test::errorOf<DataError>(run(junk)).find("junk.model: not a SentencePiece model"), std::string::npos);
  // Far more pieces than 20 KB of text holds.
  EXPECT_NE(test::errorOf<DataError>(run(sentencePiece(50'000))).find("could not train a vocabulary of 50000"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("x/train/dataset.json")));
}

// A tokenizer of 70 000 ids: each byte b becomes 65 536 + b.
class WideTokenizer final : public Tokenizer {
 public:
  const std::string& name() const override { return name_; }
  int64_t vocabSize() const override { return 70'000; }
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> out;
    for (unsigned char c : text) out.push_back(65'536 + c);
    return out;
  }
  std::string decode(const std::vector<int64_t>&) const override { return {}; }
  const std::string& model() const override { return model_; }

 private:
  std::string name_ = "wide", model_;
};

TEST(WideTokens, IdsAboveUint16AreStoredInFourBytesAndReadBack) {
  test::TempDir dir;
  TokenizeOptions o;
  o.custom = std::make_shared<WideTokenizer>();
  o.valFraction = 0;
  o.progress = false;
  o.shardTokens = 7;  // windows cross shards
  std::istringstream in("hello, wide world");
  const TokenizeResult r = tokenize("-", dir.file("w"), o, in);
  EXPECT_EQ(r.train.tokenBytes, 4);
  EXPECT_EQ(r.train.vocabSize, 70'000);
  std::vector<int64_t> want;
  for (unsigned char c : std::string("hello, wide world")) want.push_back(65'536 + c);
  EXPECT_EQ(allTokens(dir.file("w/train")), want);
  // A reader of uint16 shards refuses them: the version says 4 bytes.
  std::string manifest = test::readText(dir.file("w/train/dataset.json"));
  const std::string wide = "\"token_bytes\": 4";
  ASSERT_NE(manifest.find(wide), std::string::npos) << manifest;
  test::writeText(dir.file("w/train/dataset.json"), std::string(manifest).replace(manifest.find(wide), wide.size(), "\"token_bytes\": 3"));
  EXPECT_NE(test::errorOf<DataError>([&] { open(dir.file("w/train")); }).find("token_bytes 3"), std::string::npos);
  test::writeText(dir.file("w/train/dataset.json"), std::string(manifest).replace(manifest.find(wide), wide.size(), "\"token_bytes\": 2"));
  EXPECT_NE(test::errorOf<DataError>([&] { open(dir.file("w/train")); }).find("vocab_size 70000 is not in [1, 65536]"),
            std::string::npos);
}

TEST(WideTokens, TheHeldOutTextStartsAtALineAndAtTheSplitWhenALineEndsThere) {
  test::TempDir dir;
  TokenizeOptions o;
  o.custom = std::make_shared<WideTokenizer>();  // a tokenizer other than bytes: the split moves to a line
  o.progress = false;
  const std::string text = "first line\nsecond\n";  // 18 bytes
  for (const auto& [fraction, valBytes] : {std::pair{7.0 / 18, 7}, std::pair{5.0 / 18, 0}, std::pair{9.0 / 18, 7}}) {
    // 7 held out: the split is just after a newline and stays; 5 or 9: it
    // moves on to the next line's start.
    o.valFraction = fraction;
    std::istringstream in(text);
    const TokenizeResult r = tokenize("-", dir.file("s"), o, in);
    EXPECT_EQ(r.val.textBytes, valBytes) << fraction;
    EXPECT_EQ(r.train.textBytes + r.val.textBytes, 18) << fraction;
  }
}

}  // namespace
}  // namespace cohort::data
