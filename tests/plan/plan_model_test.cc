// cohort plan's model: memory, speed and cost of a setting from a fit, and
// the settings that would fit (cohort/plan/plan.h). No probe runs here.

#include <gtest/gtest.h>

#include <algorithm>

#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "cohort/plan/plan.h"
#include "cohort/train/state_memory.h"

namespace cohort::plan {
namespace {

constexpr double kMb = 1 << 20;

JobConfig gptJob() {
  JobConfig job;
  job.model.arch = ModelArch::gpt;
  job.training.batchSize = 8;
  job.training.epochs = 2;
  job.training.optimizer.name = OptimizerKind::adamw;
  return job;
}

// 10M trainable elements in units of 1M; 100 MB of LibTorch; 5 MB of
// activations per sample, 2 with recompute; 10 ms per sample, 5 ms per step.
Fit fit() {
  Fit f;
  f.elements.trainable = 10e6;
  f.elements.buffers = 1e3;
  f.elements.unit = 2 * 1e6 + 2 * 2e6;  // a block, and the embeddings outside every unit
  f.elements.unitWithFrozen = f.elements.unit;
  f.epochSamples = 8000;
  f.baseMb = 100;
  f.activationMbPerSample = 5;
  f.recomputeActivationMbPerSample = 2;
  f.exchangeMbPerGradientMb = 1;
  f.measuredRecompute = true;
  f.threads = 2;
  f.msPerSample = 10;
  f.recomputeMsPerSample = 13;
  f.msPerStep = 5;
  f.backwardShare = 0.6;
  f.localExchangeMsPerMb = 0.1;
  f.link = {10, 50, "given"};
  return f;
}

Setting setting(int64_t nodes, int64_t procs, int64_t zero) {
  Setting s = Setting::of(gptJob(), nodes, procs, 2);
  s.zero = zero;
  return s;
}

TEST(PlanMemory, PeakIsRuntimeStateActivationsAndTheExchange) {
  const JobConfig job = gptJob();
  const MemoryEstimate one = predictMemory(fit(), job, setting(1, 1, 0), 0);
  // AdamW: parameters, gradients and two state elements, 4 bytes each.
  EXPECT_NEAR(one.state.total(), 4 * (10e6 * 4 + 1e3), 1);
  EXPECT_DOUBLE_EQ(one.activationsMb, 8 * 5);
  EXPECT_DOUBLE_EQ(one.exchangeMb, 0);  // one rank exchanges nothing
  EXPECT_NEAR(one.peakMb, 100 + one.state.total() / kMb + 40, 1e-9);
  EXPECT_TRUE(one.fits());

  const MemoryEstimate two = predictMemory(fit(), job, setting(1, 2, 0), 0);
  EXPECT_NEAR(two.exchangeMb, 4 * 10e6 / kMb, 1e-9);  // as much as the gradients
  EXPECT_GT(two.peakMb, one.peakMb);
}

TEST(PlanMemory, ZeroStagesHoldLessPerRankAndAgreeWithTheFitCheck) {
  const JobConfig job = gptJob();
  std::vector<double> peak;
  for (int zero = 0; zero <= 3; ++zero) {
    const MemoryEstimate m = predictMemory(fit(), job, setting(2, 2, zero), 0);
    // The same function the ranks' fit check calls.
    const train::StateBytes want = train::stateBytes(fit().elements, zero, 4, job.training.optimizer, 25, zero == 3);
    EXPECT_DOUBLE_EQ(m.state.total(), want.total()) << "stage " << zero;
    peak.push_back(m.peakMb);
  }
  // Stage 1 shards the optimizer state; stage 3 everything but one unit.
  // (Stage 2's two buckets in flight may outweigh what it saves on a
  // model this small.)
  EXPECT_LT(peak[1], peak[0]);
  EXPECT_LT(peak[3], peak[1]);
}

TEST(PlanMemory, RecomputeTakesItsOwnActivations) {
  Setting s = setting(1, 1, 0);
  s.recompute = true;
  EXPECT_DOUBLE_EQ(predictMemory(fit(), gptJob(), s, 0).activationsMb, 8 * 2);
}

TEST(PlanMemory, TheNearestSettingThatFitsComesFirst) {
  const JobConfig job = gptJob();
  const Setting s = setting(1, 2, 0);
  const MemoryEstimate m = predictMemory(fit(), job, s, 0);
  // Recompute saves 8 x 3 MB: a limit just under the peak fits with it.
  const double limit = m.peakMb - 10;
  EXPECT_FALSE(predictMemory(fit(), job, s, limit).fits());
  const std::vector<Setting> alt = fittingAlternatives(fit(), job, s, limit);
  ASSERT_GE(alt.size(), 2u);
  bool recomputeAlone = false;
  double last = 0;
  for (const Setting& a : alt) {
    EXPECT_TRUE(predictMemory(fit(), job, a, limit).fits()) << a.describe();
    if (a.ranks() != s.ranks()) continue;
    recomputeAlone = recomputeAlone || (a.recompute && a.zero == 0 && a.batchSize == s.batchSize);
    // The fastest first.
    const double step = predictSpeed(fit(), job, a).stepMs;
    EXPECT_GE(step, last) << a.describe();
    last = step;
  }
  EXPECT_TRUE(recomputeAlone);
  EXPECT_FALSE(alt[0].recompute);  // stage 1 or a smaller micro-batch costs less time than recomputing
  // Below LibTorch's own share nothing fits.
  EXPECT_TRUE(fittingAlternatives(fit(), job, s, 50).empty());
}

TEST(PlanMemory, MoreRanksAtStageThreeFitWhatTwoCannot) {
  const JobConfig job = gptJob();
  const Setting s = setting(1, 2, 0);
  // Stage 3 on 2 ranks, recompute, micro-batch 1: still above this limit
  // (runtime, activations, one unit, a 1/8 share, the exchange's buffers).
  const double limit = 100 + 2 + 4 * 6e6 / kMb + (4 * 10e6 * 4 / kMb) / 8 + 4 * 10e6 / kMb + 1;
  const std::vector<Setting> alt = fittingAlternatives(fit(), job, s, limit);
  ASSERT_FALSE(alt.empty());
  EXPECT_GT(alt.back().ranks(), 2);
  EXPECT_EQ(alt.back().zero, 3);
}

TEST(PlanSpeed, NodesAddTheLinksExchangeAndLoseEfficiency) {
  const JobConfig job = gptJob();
  const SpeedEstimate one = predictSpeed(fit(), job, setting(1, 1, 0));
  EXPECT_DOUBLE_EQ(one.computeMs, 8 * 10 + 5);
  EXPECT_DOUBLE_EQ(one.stepMs, one.computeMs);
  EXPECT_DOUBLE_EQ(one.efficiency, 1);
  double lastEfficiency = 1, lastThroughput = one.samplesPerSecond;
  for (int64_t nodes : {2, 8, 64}) {
    const SpeedEstimate e = predictSpeed(fit(), job, setting(nodes, 1, 0));
    EXPECT_GT(e.linkExchangeMs, 0);
    EXPECT_LE(e.efficiency, lastEfficiency);
    EXPECT_GT(e.samplesPerSecond, lastThroughput);
    lastEfficiency = e.efficiency;
    lastThroughput = e.samplesPerSecond;
  }
  // A slower link costs more; stage 3 moves more than stage 0.
  Fit slow = fit();
  slow.link.gbps = 1;
  EXPECT_GT(predictSpeed(slow, job, setting(4, 1, 0)).linkExchangeMs,
            predictSpeed(fit(), job, setting(4, 1, 0)).linkExchangeMs);
  EXPECT_GT(predictSpeed(fit(), job, setting(4, 1, 3)).linkExchangeMs,
            predictSpeed(fit(), job, setting(4, 1, 0)).linkExchangeMs);
}

TEST(PlanCost, StepsToTheEndTimeNodeHoursAndPrice) {
  const JobConfig job = gptJob();
  const Setting s = setting(4, 1, 0);
  const SpeedEstimate e = predictSpeed(fit(), job, s);
  const CostEstimate c = predictCost(fit(), job, s, e, 3.0);
  // 8000 samples over 4 ranks of batch 8: 250 steps an epoch, 2 epochs.
  EXPECT_EQ(c.steps, 500);
  EXPECT_NEAR(c.hours, 500 * e.stepMs / 3.6e6, 1e-12);
  EXPECT_NEAR(c.nodeHours, 4 * c.hours, 1e-12);
  EXPECT_NEAR(c.price, 3 * c.nodeHours, 1e-12);
  JobConfig capped = job;
  capped.training.maxSteps = 100;
  EXPECT_EQ(predictCost(fit(), capped, s, e, 0).steps, 100);
}

TEST(PlanSetting, OverridesGiveTheSettingBack) {
  Setting s = setting(3, 2, 2);
  s.batchSize = 4;
  s.accumulate = 3;
  s.recompute = true;
  s.bucketCapMb = 6.25;
  s.threads = 1;
  const JobConfig job = loadJobFromString(
      "model: {arch: resnet18}\n"
      "data: {train: {kind: synthetic, shape: [3, 32, 32]}}\n",
      "test", s.overrides());
  const Setting back = Setting::of(job, job.distribution.nodes, job.distribution.procsPerNode, 2);
  EXPECT_EQ(back.describe(), s.describe());
}

TEST(PlanSplit, ATensorSplitHoldsItsSlicesAndSaysWhatItsSumsCarry) {
  const JobConfig job = gptJob();
  const MemoryEstimate one = predictMemory(fit(), job, setting(1, 1, 0), 0);
  Setting t2 = setting(1, 2, 0);
  t2.tensor = 2;
  const MemoryEstimate two = predictMemory(fit(), job, t2, 0);
  // About half the state: every weight cut in two but the norms and two
  // biases of each block.
  EXPECT_GT(two.state.total(), 0.49 * one.state.total());
  EXPECT_LT(two.state.total(), 0.51 * one.state.total());
  EXPECT_EQ(two.exchangeMb, 0) << "one replica exchanges no gradients";
  // Activations: the norms' and the residual's are whole on each rank
  // unless the sequence is split too.
  EXPECT_GT(two.activationsMb, 0.5 * one.activationsMb);
  EXPECT_LT(two.activationsMb, one.activationsMb);
  Setting sp = t2;
  sp.sequenceParallel = true;
  EXPECT_NEAR(predictMemory(fit(), job, sp, 0).activationsMb, 0.5 * one.activationsMb, 1e-9);
  // Two sums forward and two backward per block, of a micro-batch's
  // block_size x n_embd floats.
  const SpeedEstimate e = predictSpeed(fit(), job, t2);
  EXPECT_NEAR(e.tensorMbPerStep, 4.0 * 4 * 8 * double(job.model.blockSize) * 128 * 4 / kMb, 1e-9);
  EXPECT_GT(e.tensorExchangeMs, 0);
  EXPECT_EQ(e.pipelineIdle, 0);
  // At the same threads per rank, half the compute each (the optimizer
  // too), the sums besides.
  Setting same = t2;
  same.threads = 2;
  const SpeedEstimate halves = predictSpeed(fit(), job, same);
  const SpeedEstimate alone = predictSpeed(fit(), job, setting(1, 1, 0));
  EXPECT_NEAR(halves.computeMs - halves.tensorExchangeMs, 0.5 * alone.computeMs, 0.02 * alone.computeMs);
}

TEST(PlanSplit, APipelineStageHoldsItsBlocksAndTheMicroBatchesInFlight) {
  const JobConfig job = gptJob();
  Setting p = setting(1, 2, 0);
  p.stages = 2;
  p.microBatches = 8;
  const MemoryEstimate m = predictMemory(fit(), job, p, 0);
  ASSERT_EQ(m.stagePeakMb.size(), 2u);
  EXPECT_DOUBLE_EQ(m.peakMb, std::max(m.stagePeakMb[0], m.stagePeakMb[1]));
  // 1F1B: the first stage holds 2 micro-batches' activations at once;
  // GPipe all 8 of the round.
  Setting g = p;
  g.gpipe = true;
  EXPECT_GT(predictMemory(fit(), job, g, 0).stagePeakMb[0], m.stagePeakMb[0]);
  const SpeedEstimate e = predictSpeed(fit(), job, p);
  EXPECT_NEAR(e.pipelineIdle, 1.0 / 9, 1e-12);
  // One replica: 8 micro-batches of 8 samples a step.
  EXPECT_NEAR(e.samplesPerSecond, 64 / (e.stepMs / 1e3), 1e-9);
  EXPECT_EQ(predictCost(fit(), job, p, e, 0).steps, 2 * 125);  // 8000 samples / 64, 2 epochs
  // More stages of the same micro-batches: each idles longer.
  Setting four = p;
  four.stages = four.procsPerNode = 4;
  EXPECT_NEAR(predictSpeed(fit(), job, four).pipelineIdle, 3.0 / 11, 1e-12);
}

TEST(PlanSplit, OnlyTheGptIsSplit) {
  JobConfig job = gptJob();
  job.model.arch = ModelArch::resnet18;
  Setting t2 = setting(1, 2, 0);
  t2.tensor = 2;
  EXPECT_THROW(predictMemory(fit(), job, t2, 0), ConfigError);
}

TEST(PlanOptions, NumbersMustBePositive) {
  EXPECT_DOUBLE_EQ(positiveNumber("--price-per-node-hour", "2.5"), 2.5);
  EXPECT_EQ(positiveCount("--nodes", "8"), 8);
  for (const char* bad : {"0", "-1", "abc", "", "nan", "inf", "1e400", "3x"}) {
    EXPECT_THROW(positiveNumber("--link-gbps", bad), UsageError) << bad;
  }
  EXPECT_THROW(positiveCount("--nodes", "1.5"), UsageError);
  try {
    positiveCount("--nodes", "0");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--nodes 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cohort::plan
