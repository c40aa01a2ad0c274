#include <gtest/gtest.h>

#include "cohort/train/lr_schedule.h"

namespace cohort::train {
namespace {

TEST(LrSchedule, LinearScalingRule) {
  OptimizerConfig o;
  o.lr = 0.1;
  o.baseBatch = 256;
  EXPECT_DOUBLE_EQ(peakLearningRate(o, 1024), 0.4);
  EXPECT_DOUBLE_EQ(peakLearningRate(o, 128), 0.05);
  o.baseBatch = 0;
  EXPECT_DOUBLE_EQ(peakLearningRate(o, 1024), 0.1);
}

TEST(LrSchedule, WarmupRisesLinearlyToPeak) {
  ScheduleConfig c;
  c.warmupEpochs = 2;
  LrSchedule s(c, 1.0, 10, 100);
  EXPECT_EQ(s.warmupSteps(), 20);
  EXPECT_DOUBLE_EQ(s.at(0), 1.0 / 20);
  EXPECT_DOUBLE_EQ(s.at(9), 10.0 / 20);
  EXPECT_DOUBLE_EQ(s.at(19), 1.0);
  EXPECT_DOUBLE_EQ(s.at(50), 1.0);  // constant after warmup
}

TEST(LrSchedule, CosineDecaysToMinLrAtTheLastStep) {
  ScheduleConfig c;
  c.name = ScheduleKind::cosine;
  c.warmupEpochs = 1;
  c.minLr = 0.01;
  LrSchedule s(c, 1.0, 10, 111);                // steps 0..110; warmup 0..9
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);              // start of decay
  EXPECT_NEAR(s.at(60), 0.505, 1e-12);          // halfway: (peak + min) / 2
  EXPECT_NEAR(s.at(110), 0.01, 1e-12);          // the last step
  for (int64_t k = 11; k <= 110; ++k) EXPECT_LT(s.at(k), s.at(k - 1));
}

TEST(LrSchedule, StepDecayAtMilestones) {
  ScheduleConfig c;
  c.name = ScheduleKind::step;
  c.milestones = {3, 6};
  c.gamma = 0.1;
  LrSchedule s(c, 1.0, 100, 1000);
  EXPECT_DOUBLE_EQ(s.at(299), 1.0);
  EXPECT_DOUBLE_EQ(s.at(300), 0.1);
  EXPECT_NEAR(s.at(600), 0.01, 1e-15);
}

TEST(LrSchedule, AnchoredInEpochsAfterAResize) {
  // One epoch of 10 steps, then the rest of a 3-epoch run at 5 steps per
  // epoch (twice the global batch): the milestone at epoch 2 comes after
  // one more epoch of data, at run step 15, not at step 20.
  ScheduleConfig c;
  c.name = ScheduleKind::step;
  c.milestones = {2};
  c.gamma = 0.1;
  LrSchedule s(c, 1.0, 5, 20);
  s.anchor(10, 1.0);
  EXPECT_DOUBLE_EQ(s.at(14), 1.0);
  EXPECT_DOUBLE_EQ(s.at(15), 0.1);
  // Cosine still ends at min_lr on the run's last step.
  ScheduleConfig cos;
  cos.name = ScheduleKind::cosine;
  cos.minLr = 0.01;
  LrSchedule k(cos, 1.0, 5, 20);
  k.anchor(10, 1.0);
  EXPECT_DOUBLE_EQ(k.at(19), 0.01);
  EXPECT_GT(k.at(10), 0.5);  // a third of the way through the schedule
  EXPECT_LT(k.at(10), 1.0);
  // Warmup counted in epochs: 1.5 epochs of warmup, 1 done at 10 per epoch;
  // the last half epoch is 2.5 steps at 5 per epoch.
  ScheduleConfig w;
  w.warmupEpochs = 1.5;
  LrSchedule ww(w, 1.0, 5, 20);
  ww.anchor(10, 1.0);
  EXPECT_LT(ww.at(10), 1.0);
  EXPECT_DOUBLE_EQ(ww.at(13), 1.0);
}

}  // namespace
}  // namespace cohort::train
