#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/data/dataset_manifest.h"
#include "cohort/data/loader.h"
#include "cohort/data/sampler.h"
#include "cohort/data/shard.h"
#include "util/process.h"

namespace cohort::data {
namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

std::vector<Batch> drain(BatchLoader& l) {
  std::vector<Batch> out;
  while (auto b = l.next()) out.push_back(*b);
  return out;
}

LoaderOptions options(int threads, int prefetch, bool augment) {
  LoaderOptions o;
  o.batchSize = 4;
  o.threads = threads;
  o.prefetch = prefetch;
  o.seed = 3;
  if (augment) {
    o.transform.augment = true;
    o.transform.augmentation.hflip = true;
    o.transform.augmentation.cropPadding = 2;
  }
  o.transform.mean = {0.5f};
  o.transform.std = {0.25f};
  return o;
}

TEST(BatchLoader, BatchesComeInOrderWithTheRightSamples) {
  auto ds = makeSynthetic(30, {1, 6, 6}, 5, 1);
  BatchLoader l(ds, options(3, 2, false));
  std::vector<int64_t> order = iota(30);
  std::reverse(order.begin(), order.end());
  l.startEpoch(order, 0);
  EXPECT_EQ(l.batchesInEpoch(), 8);  // 7 full + 1 of 2
  auto batches = drain(l);
  ASSERT_EQ(batches.size(), 8u);
  std::vector<float> px(36);
  for (size_t b = 0; b < batches.size(); ++b) {
    EXPECT_EQ(batches[b].index, static_cast<int64_t>(b));
    const int64_t n = batches[b].labels.size(0);
    EXPECT_EQ(n, b + 1 < batches.size() ? 4 : 2);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t sample = order[b * 4 + static_cast<size_t>(i)];
      EXPECT_EQ(batches[b].labels[i].item<int64_t>(), ds->read(sample, px.data()));
      // normalized: (x - 0.5) / 0.25
      EXPECT_NEAR(batches[b].inputs[i][0][0][0].item<float>(), (px[0] - 0.5f) / 0.25f, 1e-6);
    }
  }
  EXPECT_FALSE(l.next().has_value());
}

TEST(BatchLoader, SameBatchesWhateverTheThreadCount) {
  auto ds = makeSynthetic(64, {1, 8, 8}, 5, 2);
  BatchLoader one(ds, options(1, 1, true));
  BatchLoader four(ds, options(4, 8, true));
  one.startEpoch(iota(64), 7);
  four.startEpoch(iota(64), 7);
  auto a = drain(one), b = drain(four);
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::equal(a[k].inputs, b[k].inputs)) << "batch " << k;
    EXPECT_TRUE(torch::equal(a[k].labels, b[k].labels));
  }
  // Augmentation depends on the epoch.
  one.startEpoch(iota(64), 8);
  auto c = drain(one);
  EXPECT_FALSE(torch::equal(a[0].inputs, c[0].inputs));
}

TEST(BatchLoader, DropLastAndRestartMidEpoch) {
  auto ds = makeSynthetic(10, {1, 4, 4}, 2, 1);
  LoaderOptions o = options(2, 2, false);
  o.dropLast = true;
  BatchLoader l(ds, o);
  l.startEpoch(iota(10), 0);
  EXPECT_EQ(l.batchesInEpoch(), 2);
  ASSERT_TRUE(l.next().has_value());
  l.startEpoch(iota(10), 1);  // abandon the rest of epoch 0
  auto b = drain(l);
  EXPECT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].index, 0);
}

TEST(BatchLoader, AbsorbTailFoldsALoneLastSampleIntoTheBatchBefore) {
  // An exact-tail sampler gives this rank 9 samples, the others 8: with
  // batches of 4 every rank must still have 2.
  auto ds = makeSynthetic(20, {1, 4, 4}, 2, 1);
  LoaderOptions o = options(2, 2, false);
  o.batchSize = 4;
  o.absorbTail = true;
  BatchLoader l(ds, o);
  l.startEpoch(iota(9), 0, 0, 8);
  EXPECT_EQ(l.batchesInEpoch(), 2);
  const auto b = drain(l);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].labels.size(0), 4);
  EXPECT_EQ(b[1].labels.size(0), 5);
  // Otherwise batches are as ever: 10 samples make 4, 4 and 2.
  l.startEpoch(iota(10), 1, 0, 9);
  EXPECT_EQ(l.batchesInEpoch(), 3);
  EXPECT_EQ(drain(l).back().labels.size(0), 2);
  // Batches of 2: the rank of 8 samples (the others have 7) has 4 batches,
  // and so does a rank of 7, whose lone last sample is its own and stays.
  o.batchSize = 2;
  BatchLoader two(ds, o);
  two.startEpoch(iota(8), 2, 0, 7);
  EXPECT_EQ(two.batchesInEpoch(), 4);
  two.startEpoch(iota(7), 3, 0, 7);
  EXPECT_EQ(two.batchesInEpoch(), 4);
  EXPECT_EQ(drain(two).back().labels.size(0), 1);
  // Batches of 1: the extra sample joins the last batch.
  o.batchSize = 1;
  BatchLoader one(ds, o);
  one.startEpoch(iota(9), 4, 0, 8);
  EXPECT_EQ(one.batchesInEpoch(), 8);
  EXPECT_EQ(drain(one).back().labels.size(0), 2);
}

class FailingDataset : public Dataset {
 public:
  int64_t size() const override { return 100; }
  SampleShape shape() const override { return {1, 2, 2}; }
  int64_t read(int64_t index, float* out, uint64_t /*seed*/) const override {
    if (index == 13) throw DataError("sample 13 is broken");
    for (int i = 0; i < 4; ++i) out[i] = 0;
    return 0;
  }
  std::string describe() const override { return "failing"; }
};

TEST(BatchLoader, WorkerErrorsReachTheConsumer) {
  BatchLoader l(std::make_shared<FailingDataset>(), options(2, 2, false));
  l.startEpoch(iota(100), 0);
  try {
    drain(l);
    FAIL() << "the error was swallowed";
  } catch (const DataError& e) {
    EXPECT_STREQ(e.what(), "sample 13 is broken");
  }
}

// Windows of tokens 0..99 cycling, and labelled texts of them.
class CountingTokens : public Dataset {
 public:
  explicit CountingTokens(SampleKind kind) : kind_(kind) {}
  int64_t size() const override { return 400; }
  SampleShape shape() const override { return {1, 1, 50}; }
  SampleKind kind() const override { return kind_; }
  int64_t vocabSize() const override { return 100; }
  int64_t read(int64_t, float*, uint64_t) const override { throw std::logic_error("not images"); }
  void readTokens(int64_t index, int64_t* out, uint64_t) const override {
    for (int64_t k = 0; k < 50; ++k) out[k] = (index + k) % 100;
  }
  int64_t readText(int64_t index, int64_t* out) const override {
    readTokens(index, out, 0);
    return index % 3;
  }
  std::string describe() const override { return "counting"; }

 private:
  SampleKind kind_;
};

// Masked language modelling: 15% of positions chosen, of those 80%
// masked, 10% another token, 10% kept; the labels are the chosen
// positions' tokens and -100 elsewhere; the same in a resumed epoch (same
// seed and epoch), other positions in another epoch.
TEST(BatchLoader, MaskedLanguageModellingChoosesFifteenPercent) {
  LoaderOptions o;
  o.batchSize = 400;
  o.threads = 2;
  o.seed = 5;
  o.maskId = 100;
  o.vocabSize = 100;
  auto epoch = [&](int64_t e) {
    BatchLoader l(std::make_shared<CountingTokens>(SampleKind::tokens), o);
    l.startEpoch(iota(400), e);
    return drain(l).at(0);
  };
  const Batch b = epoch(0);
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{400, 50}));
  ASSERT_EQ(b.labels.sizes(), (std::vector<int64_t>{400, 50}));
  int64_t chosen = 0, masked = 0, kept = 0, other = 0, leaked = 0;
  for (int64_t i = 0; i < 400; ++i) {
    for (int64_t k = 0; k < 50; ++k) {
      const int64_t original = (i + k) % 100, in = b.inputs[i][k].item<int64_t>(), label = b.labels[i][k].item<int64_t>();
      if (label == kIgnoredLabel) {
        leaked += in != original;
        continue;
      }
      EXPECT_EQ(label, original);
      ++chosen;
      masked += in == 100;
      kept += in == original;
      other += in != 100 && in != original;
    }
  }
  EXPECT_EQ(leaked, 0) << "an unchosen position changed";
  const double n = 400 * 50;
  EXPECT_NEAR(chosen / n, 0.15, 0.01);
  EXPECT_NEAR(double(masked) / chosen, 0.8, 0.03);
  EXPECT_NEAR(double(kept + other) / chosen, 0.2, 0.03);
  EXPECT_GT(other, 0.08 * chosen);  // a random token is the original 1% of the time
  EXPECT_TRUE(torch::equal(epoch(0).inputs, b.inputs)) << "the same epoch masks the same positions";
  EXPECT_FALSE(torch::equal(epoch(1).labels, b.labels)) << "another epoch masks others";
}

TEST(BatchLoader, LabelledTextsComeAsTokensAndLabels) {
  LoaderOptions o;
  o.batchSize = 8;
  o.threads = 1;
  BatchLoader l(std::make_shared<CountingTokens>(SampleKind::text), o);
  l.startEpoch({5, 7}, 0);
  const Batch b = drain(l).at(0);
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, 50}));
  EXPECT_EQ(b.inputs[1][3].item<int64_t>(), 10);
  EXPECT_EQ(b.labels[0].item<int64_t>(), 2);
  EXPECT_EQ(b.labels[1].item<int64_t>(), 1);
}

TEST(BatchLoader, EmptyEpoch) {
  BatchLoader l(makeSynthetic(4, {1, 2, 2}, 2, 1), options(2, 2, false));
  l.startEpoch({}, 0);
  EXPECT_EQ(l.batchesInEpoch(), 0);
  EXPECT_FALSE(l.next().has_value());
}

// ---- packed shards: the shuffled order through the loader ----------------

// `shards` shards of raw 1x4x4 samples; sample i's pixels are all i % 251.
std::string writeRawShards(const test::TempDir& dir, int shards, int perShard) {
  const std::string root = dir.file("raw");
  std::filesystem::create_directories(root);
  DatasetManifest m;
  m.encoding = "raw";
  m.rawShape = {1, 4, 4};
  m.classes = {"0", "1", "2", "3", "4"};
  int n = 0;
  for (int s = 0; s < shards; ++s) {
    ShardInfo info;
    info.name = "shard-" + std::to_string(s) + ".cohort";
    ShardWriter w(root + "/" + info.name);
    for (int r = 0; r < perShard; ++r, ++n) {
      const std::string px(16, static_cast<char>(n % 251));
      w.add(std::to_string(n), n % 5, px.data(), px.size());
    }
    info.records = w.records();
    info.bytes = w.finish();
    info.checksum = checksumFile(root + "/" + info.name);
    m.shards.push_back(info);
  }
  writeFileAtomic(root + "/dataset.json", datasetManifestJson(m));
  return root;
}

TEST(ShardLoader, ResumedEpochAndThreadCountsGiveTheSameBatches) {
  test::TempDir dir;
  DatasetConfig c;
  c.kind = DataKind::shards;
  c.path = writeRawShards(dir, 5, 9);
  c.shuffleWindow = 2;
  std::shared_ptr<Dataset> ds = openDataset(c, 5);
  ASSERT_EQ(ds->size(), 45);
  SamplerOptions so;
  so.size = ds->size();
  so.worldSize = 2;
  so.rank = 1;
  so.seed = 11;
  so.order = [ds](int64_t epoch) { return ds->shuffledOrder(11, epoch); };
  DistributedSampler sampler(so);
  const auto indices = sampler.indices(2);

  BatchLoader one(ds, options(1, 2, true));
  one.startEpoch(indices, 2);
  const auto full = drain(one);
  ASSERT_EQ(full.size(), 6u);  // 22 samples, batch 4
  BatchLoader three(ds, options(3, 4, true));
  three.startEpoch(indices, 2, 3);
  const auto resumed = drain(three);
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t b = 0; b < resumed.size(); ++b) {
    EXPECT_TRUE(torch::equal(resumed[b].inputs, full[b + 3].inputs)) << "batch " << b + 3;
    EXPECT_TRUE(torch::equal(resumed[b].labels, full[b + 3].labels)) << "batch " << b + 3;
  }
  // The samples are the sampler's, in its order (pixel value = sample id).
  BatchLoader plain(ds, LoaderOptions{});
  plain.startEpoch(indices, 2);
  int64_t k = 0;
  while (auto b = plain.next()) {
    for (int64_t i = 0; i < b->inputs.size(0); ++i, ++k) {
      const int64_t id = indices[static_cast<size_t>(k)];
      EXPECT_FLOAT_EQ(b->inputs[i][0][0][0].item<float>(), static_cast<float>(id % 251) / 255.0f);
      EXPECT_EQ(b->labels[i].item<int64_t>(), id % 5);
    }
  }
  EXPECT_EQ(k, 22);
}

}  // namespace
}  // namespace cohort::data
