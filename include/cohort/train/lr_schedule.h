#pragma once

// Learning rate per optimizer step: linear warmup (step s of W trains at
// peak * (s+1) / W), then constant, cosine decay reaching min_lr at the last
// step, or step decay at epoch milestones.
// The peak follows the linear scaling rule when base_batch is set:
// peak = lr * global_batch / base_batch.

#include <cstdint>

#include "cohort/config/job.h"

namespace cohort::train {

class LrSchedule {
 public:
  // stepsPerEpoch: optimizer steps per epoch; totalSteps: steps of the run.
  LrSchedule(const ScheduleConfig& config, double peakLr, int64_t stepsPerEpoch,
             int64_t totalSteps);
  // Learning rate for optimizer step `step` (0-based).
  double at(int64_t step) const;
  // A run taken up in another layout (another world size or batch, an
  // elastic resize): step `step` is where `epochsDone` epochs of data
  // (fractions allowed) had been trained on, whatever the steps per epoch
  // were before. The schedule goes on from that point of training in this
  // layout's steps: warmup, milestones and cosine stay where they belong in
  // epochs, and the last step still ends the schedule.
  void anchor(int64_t step, double epochsDone);
  int64_t warmupSteps() const { return warmupSteps_; }

 private:
  ScheduleConfig config_;
  double peak_;
  int64_t stepsPerEpoch_;
  int64_t totalSteps_;
  int64_t warmupSteps_;
  int64_t offset_ = 0;  // this layout's step count at the anchor minus the run's
};

// lr * global_batch / base_batch, or lr when base_batch is 0.
double peakLearningRate(const OptimizerConfig& config, int64_t globalBatch);

}  // namespace cohort::train
