// Token datasets: `cohort data tokenize`'s output, windows read back, the
// loader's token batches, and bad input.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "cohort/data/loader.h"
#include "cohort/data/pack.h"
#include "cohort/data/sampler.h"
#include "cohort/data/tokens.h"
#include "util/errors.h"
#include "util/process.h"

namespace cohort::data {
namespace {

namespace fs = std::filesystem;

// Text whose byte at position p is a function of p alone, so a window's
// tokens tell where it starts.
std::string patterned(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 26) % 26);
  return s;
}

TokenizeOptions quiet(double valFraction = 0.1, int64_t shardTokens = 100'000'000) {
  TokenizeOptions o;
  o.valFraction = valFraction;
  o.shardTokens = shardTokens;
  o.progress = false;
  return o;
}

std::shared_ptr<Dataset> open(const std::string& path, int64_t window, bool training) {
  DatasetConfig c;
  c.kind = DataKind::tokens;
  c.path = path;
  OpenOptions o;
  o.training = training;
  o.tokenWindow = window;
  o.cache.enabled = false;
  return openTokens(c, o);
}

std::vector<int64_t> window(const Dataset& d, int64_t index, uint64_t seed = 0) {
  std::vector<int64_t> out(static_cast<size_t>(d.shape().width));
  d.readTokens(index, out.data(), seed);
  return out;
}

std::vector<int64_t> bytesAt(const std::string& text, size_t at, size_t n) {
  std::vector<int64_t> out;
  for (size_t k = 0; k < n; ++k) out.push_back(static_cast<unsigned char>(text[at + k]));
  return out;
}

class Tokens : public ::testing::Test {
 protected:
  test::TempDir dir;
};

TEST_F(Tokens, TokenizeSplitsTheTailAndWindowsReadTheTextBack) {
  const std::string text = patterned(10'000);
  test::writeText(dir.file("a.txt"), text.substr(0, 6'000));
  test::writeText(dir.file("b.txt"), text.substr(6'000));
  fs::create_directory(dir.file("corpus"));
  fs::rename(dir.file("a.txt"), dir.file("corpus/a.txt"));
  fs::rename(dir.file("b.txt"), dir.file("corpus/b.txt"));
  std::istringstream none;
  // Shards of 1000 tokens: windows cross shard boundaries.
  const TokenizeResult r = tokenize(dir.file("corpus"), dir.file("tok"), quiet(0.1, 1'000), none);
  EXPECT_EQ(r.files, 2);
  EXPECT_EQ(r.train.records(), 9'000);
  EXPECT_EQ(r.val.records(), 1'000);
  EXPECT_EQ(r.train.shards.size(), 9u);
  EXPECT_EQ(r.train.encoding, "tokens");
  EXPECT_EQ(r.train.vocabSize, 256);

  auto train = open(dir.file("tok/train"), 65, false);
  EXPECT_EQ(train->kind(), SampleKind::tokens);
  EXPECT_EQ(train->vocabSize(), 256);
  // Windows of 65 tokens every 64: (9000 - 65) / 64 + 1.
  ASSERT_EQ(train->size(), 140);
  for (int64_t i : {0, 15, 16, 139}) {
    EXPECT_EQ(window(*train, i), bytesAt(text, static_cast<size_t>(i * 64), 65)) << "window " << i;
  }
  auto val = open(dir.file("tok/val"), 65, false);
  EXPECT_EQ(window(*val, 0), bytesAt(text, 9'000, 65));

  // `cohort data inspect` and `verify` know token datasets.
  std::ostringstream shown, checked;
  EXPECT_EQ(inspectCommand(dir.file("tok/val"), 12, {}, shown), 0);
  EXPECT_NE(shown.str().find("first 12 tokens of tokens-00000.bin, decoded:\n" + text.substr(9'000, 12)),
            std::string::npos)
      << shown.str();
  EXPECT_EQ(verifyCommand(dir.file("tok/train"), false, {}, checked), 0) << checked.str();
  EXPECT_NE(checked.str().find("tokens-00008.bin: ok, 1000 tokens"), std::string::npos) << checked.str();
}

TEST_F(Tokens, TrainingWindowsMoveTogetherByTheSeedsOffset) {
  const std::string text = patterned(1'000);
  std::istringstream in(text);
  tokenize("-", dir.file("tok"), quiet(0), in);
  // Evaluation: (1000 - 33) / 32 + 1 = 31 windows at offset 0.
  EXPECT_EQ(open(dir.file("tok/train"), 33, false)->size(), 31);
  // Training keeps room for any offset below 32: (1000 - 33 - 31) / 32 + 1 = 30.
  auto train = open(dir.file("tok/train"), 33, true);
  ASSERT_EQ(train->size(), 30);
  auto startOf = [&](const std::vector<int64_t>& w, int64_t from) {
    for (int64_t s = from; s < from + 32; ++s) {
      if (w == bytesAt(text, static_cast<size_t>(s), 33)) return s;
    }
    return int64_t{-1};
  };
  std::set<int64_t> offsets;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const int64_t last = startOf(window(*train, 29, seed), 928);
    ASSERT_GE(last, 928) << "seed " << seed << ": not a window of the text within the offsets";
    EXPECT_EQ(window(*train, 29, seed), window(*train, 29, seed));
    // The same offset for every window: they still tile the text.
    EXPECT_EQ(startOf(window(*train, 3, seed), 96), last - 26 * 32) << "seed " << seed;
    offsets.insert(last - 928);
  }
  EXPECT_GE(offsets.size(), 28u) << "the offsets spread over [0, 32)";
}

TEST_F(Tokens, TheLoaderMakesInputsAndNextTokenTargetsAndResumesExactly) {
  const std::string text = patterned(5'000);
  std::istringstream in(text);
  tokenize("-", dir.file("tok"), quiet(0), in);
  auto ds = open(dir.file("tok/train"), 17, true);
  LoaderOptions o;
  o.batchSize = 8;
  o.threads = 2;
  o.seed = 5;
  SamplerOptions so;
  so.size = ds->size();
  so.worldSize = 2;
  so.rank = 1;
  so.seed = 5;
  DistributedSampler sampler(so);
  BatchLoader full(ds, o);
  full.startEpoch(sampler.indices(3), 3);
  std::vector<Batch> all;
  while (auto b = full.next()) all.push_back(*b);
  ASSERT_GT(all.size(), 4u);
  for (const Batch& b : all) {
    ASSERT_EQ(b.inputs.dim(), 2);
    EXPECT_EQ(b.inputs.size(1), 16);
    EXPECT_EQ(b.inputs.scalar_type(), torch::kInt64);
    EXPECT_TRUE(torch::equal(b.inputs.narrow(1, 1, 15), b.labels.narrow(1, 0, 15)));
  }
  // A resumed epoch at batch 3 builds the same batches as the full one.
  BatchLoader resumed(ds, o);
  resumed.startEpoch(sampler.indices(3), 3, 3);
  for (size_t k = 3; k < all.size(); ++k) {
    auto b = resumed.next();
    ASSERT_TRUE(b);
    EXPECT_TRUE(torch::equal(b->inputs, all[k].inputs)) << "batch " << k;
    EXPECT_TRUE(torch::equal(b->labels, all[k].labels)) << "batch " << k;
  }
}

TEST_F(Tokens, BadInputIsNamed) {
  std::istringstream empty;
  EXPECT_NE(test::errorOf<DataError>([&] { tokenize("-", dir.file("e"), quiet(), empty); })
                .find("standard input: no text to tokenize"),
            std::string::npos);
  fs::create_directory(dir.file("nothing"));
  EXPECT_NE(test::errorOf<DataError>([&] { tokenize(dir.file("nothing"), dir.file("e"), quiet(), empty); })
                .find("no text to tokenize"),
            std::string::npos);

  std::istringstream small(patterned(100));
  tokenize("-", dir.file("tok"), quiet(0), small);
  EXPECT_NE(test::errorOf<DataError>([&] { open(dir.file("tok/train"), 257, false); })
                .find("100 tokens, fewer than one window of model.block_size + 1 = 257"),
            std::string::npos);

  // A flipped byte in a shard is caught by its checksum before any window is read.
  const std::string shard = dir.file("tok/train/tokens-00000.bin");
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('Z');
  }
  auto ds = open(dir.file("tok/train"), 9, false);
  EXPECT_NE(test::errorOf<DataError>([&] { window(*ds, 0); }).find("(corrupt or replaced shard)"),
            std::string::npos);
  std::ostringstream checked;
  EXPECT_EQ(verifyCommand(dir.file("tok/train"), false, {}, checked), 1);
  EXPECT_NE(checked.str().find("tokens-00000.bin: checksum"), std::string::npos) << checked.str();

  // A packed image dataset is not a token dataset.
  std::istringstream t(patterned(50));
  tokenize("-", dir.file("t2"), quiet(0), t);
  std::string manifest = test::readText(dir.file("t2/train/dataset.json"));
  const std::string tokensEncoding = "\"encoding\": \"tokens\"";
  ASSERT_NE(manifest.find(tokensEncoding), std::string::npos) << manifest;
  manifest.replace(manifest.find(tokensEncoding), tokensEncoding.size(),
                   "\"encoding\": \"raw\", \"raw_shape\": [1, 1, 1]");
  test::writeText(dir.file("t2/train/dataset.json"), manifest);
  EXPECT_NE(test::errorOf<DataError>([&] { open(dir.file("t2/train"), 9, false); })
                .find("encoding 'raw', not a token dataset"),
            std::string::npos);
}

TEST(TokenText, BytesRoundTripAndOtherTokenizersAreRefused) {
  const std::string text("Gr\xc3\xbc\xc3\x9f" "e\n\xff\x00 end", 14);  // UTF-8, then not
  const auto bytes = makeTokenizer(kByteTokenizer, "", "test");
  const std::vector<int64_t> t = bytes->encode(text);
  EXPECT_EQ(t.size(), text.size());
  EXPECT_EQ(bytes->decode(t), text);
  EXPECT_NE(test::errorOf<DataError>([] { makeTokenizer("bpe-50k", "", "job.yaml"); })
                .find("job.yaml: tokenizer 'bpe-50k' is not known"),
            std::string::npos);
  EXPECT_NE(test::errorOf<DataError>([&] { bytes->decode({256}); }).find("token 256 is not a byte"),
            std::string::npos);
}

}  // namespace
}  // namespace cohort::data
