// Gradient accumulation: k micro-steps of batch b are one step of batch k*b,
// in one process and across ranks; the plan of steps and micro-batches the
// training loop follows (train/detail/setup.h); the stop protocol of one rank.

#include <gtest/gtest.h>

#include "cohort/core/error.h"
#include "cohort/train/stop.h"
#include "train/detail/setup.h"
#include "train/detail/stop_protocol.h"
#include "util/jobs.h"
#include "util/runs.h"

namespace cohort {
namespace {

std::vector<std::string> run(int batch, int accumulate) {
  return {"training.max_steps=5", "training.batch_size=" + std::to_string(batch),
          "training.accumulate_steps=" + std::to_string(accumulate)};
}

TEST(Accumulation, TwoMicroStepsOfBEqualOneStepOf2B) {
  test::TempDir dir;
  auto big = test::trainTiny(dir, "big", 1, run(8, 1));
  auto accumulated = test::trainTiny(dir, "acc", 1, run(4, 2));
  EXPECT_LT(test::maxDifference(big, accumulated), 1e-5);
  auto small = test::trainTiny(dir, "small", 1, run(4, 1));
  EXPECT_GT(test::maxDifference(big, small), 1e-3) << "the comparison cannot tell batches apart";
}

TEST(Accumulation, AcrossRanks) {
  test::TempDir dir;
  auto big = test::trainTiny(dir, "big", 2, run(8, 1));
  auto accumulated = test::trainTiny(dir, "acc", 2, run(4, 2));
  EXPECT_LT(test::maxDifference(big, accumulated), 1e-5);
  // Inner micro-steps exchanged nothing: 5 optimizer steps, 5 exchanges.
  const std::string log = test::readText(dir.file("acc/logs/rank-1.log"));
  EXPECT_NE(log.find("gradient exchanges: 5;"), std::string::npos) << log;
}

JobConfig planJob(int64_t batch, int64_t accumulate, bool dropLast) {
  JobConfig job;
  job.training.batchSize = batch;
  job.training.accumulateSteps = accumulate;
  job.training.epochs = 3;
  job.data.dropLast = dropLast;
  return job;
}

// 10 samples per rank in batches of 4 make micro-batches of 4, 4 and 2; two
// per step make steps of 8 and 2 samples, and the loss of each micro-batch
// weighs by its share of its step's samples.
TEST(StepPlan, AccumulationCyclesCoverTheEpochWithAShortLastOne) {
  const train::detail::StepPlan p = train::detail::planSteps(planJob(4, 2, false), 10, 3);
  EXPECT_EQ(p.batchesPerEpoch, 3);
  EXPECT_EQ(p.stepsPerEpoch, 2);
  EXPECT_EQ(p.totalSteps, 6);
  EXPECT_EQ(p.globalBatch, 4 * 3 * 2);
  const auto c0 = p.cycleOf(0), c1 = p.cycleOf(1), c2 = p.cycleOf(2);
  EXPECT_EQ(c0.first, 0);
  EXPECT_EQ(c0.length, 2);
  EXPECT_EQ(c0.samples, 8);
  EXPECT_FALSE(c0.last);
  EXPECT_EQ(c1.first, 0);
  EXPECT_TRUE(c1.last);
  EXPECT_EQ(c2.first, 2);
  EXPECT_EQ(c2.length, 1);
  EXPECT_EQ(c2.samples, 2);
  EXPECT_TRUE(c2.last);
}

TEST(StepPlan, DropLastDropsTheShortBatchAndMaxStepsCapsTheRun) {
  const train::detail::StepPlan p = train::detail::planSteps(planJob(4, 1, true), 10, 2);
  EXPECT_EQ(p.batchesPerEpoch, 2);
  EXPECT_EQ(p.cycleOf(1).samples, 4);
  JobConfig capped = planJob(4, 1, true);
  capped.training.maxSteps = 5;
  EXPECT_EQ(train::detail::planSteps(capped, 10, 2).totalSteps, 5);
  EXPECT_THROW(train::detail::planSteps(planJob(4, 1, true), 3, 2), DataError)
      << "3 samples per rank make no batch of 4 with drop_last";
}

// One rank alone: a stop request is served at the step it is seen, only with
// checkpoints on (then SIGTERM waits for the step: graceful).
TEST(StopProtocol, OneRankStopsAtTheStepItSeesTheRequestOnlyWithCheckpoints) {
  comm::Comm alone;
  train::StopRequest& request = train::stopRequest();
  request.signal = 0;
  {
    train::detail::StopProtocol off(alone, false);
    EXPECT_FALSE(request.graceful);
    request.signal = 15;
    EXPECT_FALSE(off.due(3));
    request.signal = 0;
  }
  train::detail::StopProtocol on(alone, true);
  EXPECT_TRUE(request.graceful);
  EXPECT_FALSE(on.due(3));
  request.signal = 15;
  EXPECT_TRUE(on.due(4));
  EXPECT_TRUE(on.due(5));
  request.signal = 0;
  request.graceful = false;
}

}  // namespace
}  // namespace cohort
