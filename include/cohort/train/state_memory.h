#pragma once

// The bytes of a rank's training state at a ZeRO stage, from a model's
// element counts alone: what the fit check before training
// (src/train/detail/memory_fit.h) and `cohort plan` (plan/plan.h) both
// compute, so that the check and the prediction cannot disagree.
//
// This header does not include LibTorch.

#include <algorithm>

#include "cohort/config/job.h"

namespace cohort::train {

// A model's float32 elements (tied tensors once), counted by
// detail::countElements, with the sharding units of ZeRO stage 3.
struct ModelElements {
  double trainable = 0;  // parameters that train
  double frozen = 0;     // parameters that do not (model.lora's base)
  double buffers = 0;    // floating-point buffers (BatchNorm's statistics)
  // Stage 3, one unit whole while it runs: the largest over the units of
  // 2 x its trainable elements (parameters and gradients), plus 2 x those
  // outside every unit (gathered around the whole forward and backward);
  // `unitWithFrozen` adds each unit's frozen elements, for a model whose
  // frozen weights are held in parts too (built unit by unit).
  double unit = 0;
  double unitWithFrozen = 0;
};

struct StateBytes {
  // parameters: with frozen weights and buffers; unit: stage 3, one unit
  // whole; stage 2, the gradient buckets in flight; wholeModel: the model as
  // built, before it is cut into parts.
  double parameters = 0, gradients = 0, optimizer = 0, unit = 0, wholeModel = 0;
  // What a rank would hold at stage 3 on any number of ranks: `fixed`
  // (buffers, and frozen weights unless built by unit) + `shardable`
  // (parameters, gradients and optimizer state of all ranks) / ranks +
  // `stage3Unit` (one unit's parameters and gradients, whole, with those
  // outside every unit).
  double fixed = 0, shardable = 0, stage3Unit = 0;
  double total() const { return std::max(parameters + gradients + optimizer + unit, wholeModel); }
};

// Optimizer state elements per trainable parameter: AdamW 2, SGD with
// momentum 1, without 0.
double optimizerCopies(const OptimizerConfig& optimizer);

// What each rank of `world` will hold at ZeRO `stage` (float32): its share
// of the trainable parameters, their gradients and the optimizer's state,
// the frozen weights and buffers whole; at stage 3 one unit whole, at stage
// 2 two buckets of `bucketCapMb`. `byUnit`: the model is built unit by unit
// (parallel/unit_load.h), so no step holds it whole, and at stage 3 its
// frozen weights are held in parts as the trainable ones, gathered with
// their unit.
StateBytes stateBytes(const ModelElements& model, int stage, int world, const OptimizerConfig& optimizer,
                      double bucketCapMb, bool byUnit = false);

}  // namespace cohort::train
