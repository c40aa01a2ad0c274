// Dynamic loss scaling (train/loss_scale.h): the scaler's rules on their own,
// then in 2-rank runs: scaled and unscaled training end with the same
// weights, and an injected overflow drops one step and backs the scale off.

#include "cohort/train/loss_scale.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cohort/ckpt/state_dict.h"
#include "util/jobs.h"

namespace cohort {
namespace {

LossScaleConfig small() {
  LossScaleConfig c;
  c.init = 1024;
  c.growthInterval = 3;
  c.minScale = 64;
  c.maxScale = 4096;
  return c;
}

TEST(LossScaler, GrowsAfterTheIntervalAndBacksOffOnAnOverflow) {
  train::LossScaler s(small());
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 2048) << "three good steps in a row";
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1024) << "an overflow halves it";
  EXPECT_EQ(s.skipped(), 1);
  EXPECT_EQ(s.skippedInARow(), 1);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024) << "the overflow started the count again";
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.skippedInARow(), 0);
  for (int k = 0; k < 9; ++k) s.update(true);
  EXPECT_EQ(s.scale(), 4096) << "never above max_scale";
  for (int k = 0; k < 10; ++k) EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 64) << "never below min_scale";
  EXPECT_EQ(s.skipped(), 11);
  EXPECT_EQ(s.skippedInARow(), 10);
}

TEST(LossScaler, AutoScalesFloat16Only) {
  LossScaleConfig c;
  EXPECT_TRUE(train::lossScalingOn(c, Precision::fp16));
  EXPECT_FALSE(train::lossScalingOn(c, Precision::bf16));
  EXPECT_FALSE(train::lossScalingOn(c, Precision::fp32));
  c.enabled = LossScaling::on;
  EXPECT_TRUE(train::lossScalingOn(c, Precision::fp32));
  c.enabled = LossScaling::off;
  EXPECT_FALSE(train::lossScalingOn(c, Precision::fp16));
}

struct ScaledRun {
  test::TempDir dir;
  test::ProcessResult result;
  nlohmann::json summary;
  ScaledRun(const std::vector<std::string>& sets, const std::map<std::string, std::string>& env = {}) {
    const std::string job = dir.file("job.yaml");
    test::writeText(job, test::tinyJobYaml("scale"));
    std::vector<std::string> args{"run", job, "--procs", "2", "--run-dir", dir.file("run"),
                                  "--set", "training.epochs=2"};
    for (const auto& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    result = test::cohort(args, env);
    if (result.exitCode == 0) summary = nlohmann::json::parse(test::readText(dir.file("run/summary.json")));
  }
  ckpt::StateDict weights() const { return ckpt::readStateDict(dir.file("run/model/final.pt")); }
};

TEST(LossScaling, ScaledTrainingEndsWithTheUnscaledWeights) {
  // Scales are powers of two: multiplying the loss and dividing the
  // gradients by one changes no bit (without an overflow or underflow).
  const ScaledRun plain({});
  const ScaledRun scaled({"training.loss_scale.enabled=on", "training.loss_scale.growth_interval=4"});
  ASSERT_EQ(plain.result.exitCode, 0) << plain.result.describe();
  ASSERT_EQ(scaled.result.exitCode, 0) << scaled.result.describe();
  EXPECT_EQ(plain.summary.count("loss_scale"), 0u);
  // 2 epochs of 6 steps (96 samples, 2 ranks x 8), growth every 4: 65536 * 2^3.
  EXPECT_EQ(scaled.summary["loss_scale"].get<double>(), 65536.0 * 8);
  const auto a = plain.weights(), b = scaled.weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::equal(a[k].second, b[k].second)) << a[k].first;
  }
}

TEST(LossScaling, AKilledRankResumesWithTheCheckpointedScale) {
  // Growth every 4 of 12 steps; killed after step 7 and resumed from a
  // checkpoint of step 3 or 6, between growths: the scale ends where an
  // uninterrupted run's does (65536 * 2^3) only if the scale and the good
  // steps towards the next growth were both restored.
  const ScaledRun run({"training.loss_scale.enabled=on", "training.loss_scale.growth_interval=4",
                       "checkpoint.every_steps=3", "checkpoint.when_behind=wait",
                       "distribution.max_restarts=2"},
                      {{"COHORT_FAULT", "kill@rank1:step7"}});
  ASSERT_EQ(run.result.exitCode, 0) << run.result.describe();
  EXPECT_EQ(run.summary["restart_count"], 1) << run.summary.dump(2);
  ASSERT_TRUE(run.summary.contains("resumed_from")) << run.summary.dump(2);
  EXPECT_EQ(run.summary["loss_scale"].get<double>(), 65536.0 * 8);
  const std::string log = test::readText(run.dir.file("run/logs/rank-0.log"));
  EXPECT_NE(log.find(" good steps towards growth)"), std::string::npos) << log;
}

TEST(LossScaling, AnOverflowDropsTheStepAndBacksOff) {
  // NaN inputs on rank 1 in step 4 stand for an overflow in float16.
  const ScaledRun run({"training.loss_scale.enabled=on"}, {{"COHORT_FAULT", "nan@rank1:step3"}});
  ASSERT_EQ(run.result.exitCode, 0) << run.result.describe();
  EXPECT_EQ(run.summary["nonfinite_skipped"], 1);
  EXPECT_EQ(run.summary["loss_scale"].get<double>(), 32768.0);
  bool backoff = false;
  for (const auto& j : test::readJsonLines(run.dir.file("run/metrics.jsonl"))) {
    if (j.value("event", "") == "loss_scale_backoff") {
      backoff = j["step"] == 4 && j["scale"].get<double>() == 32768.0;
    }
    if (j.contains("loss")) {
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>())) << j.dump();
    }
  }
  EXPECT_TRUE(backoff);
  const auto log = test::readText(run.dir.file("run/logs/rank-0.log"));
  EXPECT_NE(log.find("step 4: gradients overflowed"), std::string::npos) << log;
  for (const auto& [name, t] : run.weights()) EXPECT_TRUE(t.isfinite().all().item<bool>()) << name;
}

TEST(LossScaling, AScaleTooLargeOverflowsBacksOffAndTrainingGoesOn) {
  // Half the loss times 1e39 is past float32's largest value (3.4e38): the
  // scale is really applied, the first steps overflow and are dropped until
  // it is small enough, and the gradients are divided by it again.
  const ScaledRun run({"training.loss_scale.enabled=on", "training.loss_scale.init=1e39",
                       "training.loss_scale.max_scale=1e39"});
  ASSERT_EQ(run.result.exitCode, 0) << run.result.describe();
  EXPECT_GE(run.summary["nonfinite_skipped"].get<int64_t>(), 1);
  EXPECT_LT(run.summary["nonfinite_skipped"].get<int64_t>(), 12) << "some steps were applied";
  EXPECT_LT(run.summary["loss_scale"].get<double>(), 1e39);
  for (const auto& [name, t] : run.weights()) EXPECT_TRUE(t.isfinite().all().item<bool>()) << name;
}

TEST(LossScaling, Float16IsRefusedWithoutCuda) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("fp16"));
  auto r = test::cohort({"validate", dir.file("job.yaml"), "--set", "training.precision=fp16"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("training.precision: fp16 needs a CUDA build"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cohort
