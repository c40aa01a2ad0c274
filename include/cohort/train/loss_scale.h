#pragma once

// Dynamic loss scaling (training.loss_scale), for float16 training: the
// loss is multiplied by a scale before backward so that small gradients do
// not underflow float16, and the gradients are divided by it before the
// optimizer step. A step whose gradients overflowed (Inf or NaN) is skipped
// and the scale backs off; after `growth_interval` good steps in a row it
// grows again. The same rules as PyTorch's GradScaler. Checkpoints keep
// the scale and the good steps towards the next growth (the manifest's
// extra.loss_scale); a resumed run continues from them.

#include <cstdint>

#include "cohort/config/job.h"

namespace cohort::train {

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);

  double scale() const { return scale_; }
  // After the step's gradients were exchanged (the same verdict on every
  // rank): whether they are finite. Finite: the step is applied and counts
  // towards growth. Not: the step is skipped, the scale is multiplied by the
  // backoff factor and the good steps start again from 0. Returns whether
  // the step may be applied.
  bool update(bool gradientsFinite);

  // What a checkpoint keeps and a resumed run restores.
  struct State {
    double scale = 0;
    int64_t goodSteps = 0;  // finite steps since the last change of the scale
  };
  State state() const { return {scale_, goodSteps_}; }
  // The scale is clamped to [min_scale, max_scale] of this job.
  void restore(const State& state);

  int64_t skipped() const { return skipped_; }            // steps skipped so far
  int64_t skippedInARow() const { return skippedInARow_; }

 private:
  LossScaleConfig config_;
  double scale_;
  int64_t goodSteps_ = 0;
  int64_t skipped_ = 0;
  int64_t skippedInARow_ = 0;
};

// Whether training.loss_scale.enabled turns scaling on for this precision
// (auto: only for fp16).
bool lossScalingOn(const LossScaleConfig& config, Precision precision);

}  // namespace cohort::train
