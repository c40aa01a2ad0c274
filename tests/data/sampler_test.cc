#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cohort/data/sampler.h"

namespace cohort::data {
namespace {

class SamplerTest : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(SamplerTest, RanksGetDisjointEqualSlicesOfOnePermutation) {
  const auto [world, size] = GetParam();
  std::vector<std::vector<int64_t>> slices;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s({size, world, r, true, 42, true, {}});
    slices.push_back(s.indices(3));
    EXPECT_EQ(static_cast<int64_t>(slices.back().size()), size / world);
  }
  std::set<int64_t> seen;
  for (const auto& s : slices) {
    for (int64_t i : s) {
      EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " visited twice";
      EXPECT_GE(i, 0);
      EXPECT_LT(i, size);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), (size / world) * world);
}

TEST_P(SamplerTest, StepKOfNRanksIsStepKOfOneProcessWithNTimesTheBatch) {
  const auto [world, size] = GetParam();
  const int64_t b = 3;
  DistributedSampler single({size, 1, 0, true, 9, true, {}});
  const auto all = single.indices(1);
  const int64_t steps = (size / world) / b;
  for (int64_t k = 0; k < steps; ++k) {
    std::multiset<int64_t> fromRanks;
    for (int r = 0; r < world; ++r) {
      auto mine = DistributedSampler({size, world, r, true, 9, true, {}}).indices(1);
      fromRanks.insert(mine.begin() + k * b, mine.begin() + (k + 1) * b);
    }
    std::multiset<int64_t> fromOne(all.begin() + k * b * world, all.begin() + (k + 1) * b * world);
    EXPECT_EQ(fromRanks, fromOne) << "step " << k;
  }
}

// Taken up at position `from` (a resume on another world size): the
// ranks share what the epoch's order holds from there up to its even end,
// each the same count, and a run of N ranks that had stopped at `from`
// together with them visits every position before the end exactly once.
TEST_P(SamplerTest, AnEpochTakenUpAtAPositionVisitsTheRestOfItsOrderOnce) {
  const auto [world, size] = GetParam();
  DistributedSampler single({size, 1, 0, true, 42, true, {}});
  const auto order = single.indices(3);  // the epoch's whole order
  for (int64_t from : {int64_t{0}, int64_t{1}, int64_t{7}, size / 2, size / world * world, size}) {
    std::multiset<int64_t> taken;
    int64_t count = -1;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s({size, world, r, true, 42, true, {}});
      const auto mine = s.indices(3, from);
      EXPECT_EQ(static_cast<int64_t>(mine.size()), s.samplesPerRank(from));
      if (count >= 0) {
        EXPECT_EQ(static_cast<int64_t>(mine.size()), count) << "rank " << r;
      }
      count = static_cast<int64_t>(mine.size());
      taken.insert(mine.begin(), mine.end());
    }
    const int64_t end = std::max(from, from + (size / world * world - from) / world * world);
    std::multiset<int64_t> expected(order.begin() + std::min(from, size), order.begin() + std::min(end, size));
    EXPECT_EQ(taken, expected) << "from " << from << ", " << world << " ranks, " << size << " samples";
    if (from == 0) {
      EXPECT_EQ(count, size / world);
    }
  }
  // From a multiple of N, a rank's list is the tail of its list from 0.
  DistributedSampler r0({size, world, 0, true, 42, true, {}});
  const auto whole = r0.indices(3);
  const int64_t skip = std::min<int64_t>(2, static_cast<int64_t>(whole.size()));
  const auto tail = r0.indices(3, skip * world);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), whole.begin() + skip));
  EXPECT_EQ(tail.size() + static_cast<size_t>(skip), whole.size());
}

TEST_P(SamplerTest, EvaluationVisitsEverySampleOnce) {
  const auto [world, size] = GetParam();
  std::multiset<int64_t> seen;
  for (int r = 0; r < world; ++r) {
    auto idx = DistributedSampler({size, world, r, false, 0, false, {}}).indices(0);
    seen.insert(idx.begin(), idx.end());
  }
  ASSERT_EQ(static_cast<int64_t>(seen.size()), size);
  for (int64_t i = 0; i < size; ++i) EXPECT_EQ(seen.count(i), 1u);
}

INSTANTIATE_TEST_SUITE_P(WorldsAndSizes, SamplerTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(int64_t{0}, int64_t{1}, int64_t{7},
                                                              int64_t{100}, int64_t{1001})));

TEST(Sampler, EpochsShuffleDifferentlyAndReproducibly) {
  DistributedSampler s({1000, 2, 1, true, 5, true, {}});
  EXPECT_EQ(s.indices(0), s.indices(0));
  EXPECT_NE(s.indices(0), s.indices(1));
  DistributedSampler other({1000, 2, 1, true, 6, true, {}});
  EXPECT_NE(s.indices(0), other.indices(0));
}

TEST(Sampler, PermutationIsAPermutation) {
  auto p = permutation(257, 1, 2);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 257; ++i) EXPECT_EQ(sorted[i], i);
  // Pinned values: the data order must not change across releases or
  // platforms, or a resumed run would visit different samples.
  EXPECT_EQ(permutation(10, 1, 0), (std::vector<int64_t>{3, 9, 7, 6, 0, 8, 5, 1, 4, 2}));
  EXPECT_EQ(permutation(10, 1, 1), (std::vector<int64_t>{4, 3, 0, 7, 8, 9, 2, 6, 5, 1}));
}

TEST(Sampler, ExactTailVisitsEverySampleOnceFromAnyPosition) {
  // An elastic epoch: 2 ranks up to position 1000, then 3 ranks, of 4097.
  const int64_t size = 4097;
  std::multiset<int64_t> seen;
  for (int r = 0; r < 2; ++r) {
    SamplerOptions o{size, 2, r, true, 5, true, {}};
    o.exactTail = true;
    const auto mine = DistributedSampler(o).indices(0);
    seen.insert(mine.begin(), mine.begin() + 500);  // 500 each: positions [0, 1000)
  }
  for (int r = 0; r < 3; ++r) {
    SamplerOptions o{size, 3, r, true, 5, true, {}};
    o.exactTail = true;
    DistributedSampler s(o);
    const auto mine = s.indices(0, 1000);
    // 3097 positions left: 1033 for rank 0, 1032 for the others.
    EXPECT_EQ(static_cast<int64_t>(mine.size()), r == 0 ? 1033 : 1032);
    EXPECT_EQ(s.samplesPerRank(1000), static_cast<int64_t>(mine.size()));
    EXPECT_EQ(s.sharedSamplesPerRank(1000), 1032);
    seen.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), size);
  for (int64_t i = 0; i < size; ++i) EXPECT_EQ(seen.count(i), 1u) << "sample " << i;
}

}  // namespace
}  // namespace cohort::data
