// The pipeline's schedules and its split of blocks into stages, on their
// own (parallel/pipeline.h): every micro-batch goes forward then backward
// once on every stage, 1F1B holds the activations of at most P - s
// micro-batches on stage s, GPipe all of them; the split is contiguous,
// covers every block and minimizes the slowest stage.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "cohort/parallel/pipeline.h"

namespace cohort::parallel {
namespace {

// The most micro-batches whose forward has run and backward has not.
int heldPeak(const std::vector<ScheduleStep>& steps) {
  int held = 0, peak = 0;
  for (const auto& s : steps) {
    held += s.forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

TEST(PipelineSchedule, EveryMicroBatchGoesForwardThenBackwardOnceOnEveryStage) {
  for (ScheduleKind kind : {ScheduleKind::oneFOneB, ScheduleKind::gpipe}) {
    for (int stages : {1, 2, 3, 4}) {
      for (int micro : {1, 2, 4, 7, 8}) {
        for (int stage = 0; stage < stages; ++stage) {
          const auto steps = scheduleOf(kind, stage, stages, micro);
          ASSERT_EQ(steps.size(), static_cast<size_t>(2 * micro));
          std::vector<int> forwardAt(static_cast<size_t>(micro), -1), backwardAt(static_cast<size_t>(micro), -1);
          for (size_t k = 0; k < steps.size(); ++k) {
            auto& at = steps[k].forward ? forwardAt : backwardAt;
            ASSERT_EQ(at[static_cast<size_t>(steps[k].micro)], -1) << "twice";
            at[static_cast<size_t>(steps[k].micro)] = static_cast<int>(k);
          }
          int lastForward = -1, lastBackward = -1;
          for (int i = 0; i < micro; ++i) {
            EXPECT_LT(forwardAt[static_cast<size_t>(i)], backwardAt[static_cast<size_t>(i)]) << i;
            // In micro-batch order both ways: neighbours send and receive in that order.
            EXPECT_GT(forwardAt[static_cast<size_t>(i)], lastForward);
            EXPECT_GT(backwardAt[static_cast<size_t>(i)], lastBackward);
            lastForward = forwardAt[static_cast<size_t>(i)];
            lastBackward = backwardAt[static_cast<size_t>(i)];
          }
          const int peak = heldPeak(steps);
          if (kind == ScheduleKind::gpipe) {
            EXPECT_EQ(peak, micro);
          } else {
            EXPECT_EQ(peak, std::min(stages - stage, micro)) << stage << "/" << stages << " m " << micro;
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, OneFOneBAlternatesOnceThePipelineIsFull) {
  // Stage 0 of 3 with 5 micro-batches: two forwards fill the pipeline.
  const auto steps = scheduleOf(ScheduleKind::oneFOneB, 0, 3, 5);
  std::string order;
  for (const auto& s : steps) order += (s.forward ? "F" : "B") + std::to_string(s.micro) + " ";
  EXPECT_EQ(order, "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4 ");
  // The last stage starts its backwards at once.
  const auto last = scheduleOf(ScheduleKind::oneFOneB, 2, 3, 3);
  EXPECT_TRUE(last[0].forward);
  EXPECT_FALSE(last[1].forward);
}

TEST(PipelineSchedule, TheBubbleIsPMinusOneOverMPlusPMinusOne) {
  EXPECT_DOUBLE_EQ(bubbleFraction(2, 8), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(bubbleFraction(4, 4), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(bubbleFraction(1, 4), 0.0);
}

TEST(PipelineSplit, BalancesTheSlowestStageWithConsecutiveBlocks) {
  // Equal blocks: as even as can be, the later stages taking the extra ones.
  EXPECT_EQ(balanceStages(std::vector<double>(8, 1.0), 2), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(balanceStages(std::vector<double>(5, 1.0), 2), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(balanceStages(std::vector<double>(4, 1.0), 4), (std::vector<int64_t>{1, 1, 1, 1}));
  // A heavy first block (the embeddings) and last (the head).
  EXPECT_EQ(balanceStages({3, 1, 1, 1, 1, 1}, 2), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(balanceStages({1, 1, 1, 1, 1, 5}, 3), (std::vector<int64_t>{2, 3, 1}));
  // Whatever the costs: every block once, each stage at least one, and no
  // other split has a cheaper slowest stage (checked by brute force).
  const std::vector<double> costs{2, 7, 1, 8, 2, 8, 1, 8};
  for (int stages = 1; stages <= 4; ++stages) {
    const auto split = balanceStages(costs, stages);
    ASSERT_EQ(split.size(), static_cast<size_t>(stages));
    EXPECT_EQ(std::accumulate(split.begin(), split.end(), int64_t{0}), 8);
    auto worst = [&](const std::vector<int64_t>& s) {
      double w = 0;
      size_t at = 0;
      for (int64_t n : s) {
        double sum = 0;
        for (int64_t k = 0; k < n; ++k) sum += costs[at++];
        w = std::max(w, sum);
      }
      return w;
    };
    double best = 1e9;
    std::vector<int64_t> trial(static_cast<size_t>(stages), 1);
    std::function<void(int, int)> search = [&](int stage, int left) {
      if (stage == stages - 1) {
        trial[static_cast<size_t>(stage)] = left;
        if (left >= 1) best = std::min(best, worst(trial));
        return;
      }
      for (int n = 1; n <= left - (stages - stage - 1); ++n) {
        trial[static_cast<size_t>(stage)] = n;
        search(stage + 1, left - n);
      }
    };
    search(0, 8);
    EXPECT_DOUBLE_EQ(worst(split), best) << stages << " stages";
    for (int64_t n : split) EXPECT_GE(n, 1);
  }
}

}  // namespace
}  // namespace cohort::parallel
