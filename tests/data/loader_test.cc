#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/core/error.h"
#include "cohort/data/loader.h"

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
      EXPECT_NEAR(batches[b].images[i][0][0][0].item<float>(), (px[0] - 0.5f) / 0.25f, 1e-6);
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
    EXPECT_TRUE(torch::equal(a[k].images, b[k].images)) << "batch " << k;
    EXPECT_TRUE(torch::equal(a[k].labels, b[k].labels));
  }
  // Augmentation depends on the epoch.
  one.startEpoch(iota(64), 8);
  auto c = drain(one);
  EXPECT_FALSE(torch::equal(a[0].images, c[0].images));
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

class FailingDataset : public Dataset {
 public:
  int64_t size() const override { return 100; }
  SampleShape shape() const override { return {1, 2, 2}; }
  int64_t read(int64_t index, float* out) const override {
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

TEST(BatchLoader, EmptyEpoch) {
  BatchLoader l(makeSynthetic(4, {1, 2, 2}, 2, 1), options(2, 2, false));
  l.startEpoch({}, 0);
  EXPECT_EQ(l.batchesInEpoch(), 0);
  EXPECT_FALSE(l.next().has_value());
}

}  // namespace
}  // namespace cohort::data
