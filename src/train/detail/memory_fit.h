#pragma once

// Whether a rank's training state can fit the memory its machine's ranks
// may use, checked before the optimizer allocates its state: the
// parameters, gradients and optimizer state this rank holds (with ZeRO, its
// parts; at stage 3 also one gathered unit's parameters and gradients)
// against the process's memory limit (core/memory_limit.h) shared by the
// machine's ranks. A lower bound: activations and LibTorch itself come on
// top, so passing proves nothing, but failing means the run cannot train.

#include <torch/nn/module.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cohort/config/job.h"
#include "cohort/core/memory_limit.h"

namespace cohort::train::detail {

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

// What each rank of `world` will hold at ZeRO `stage` (float32; tied
// tensors once): its share of the trainable parameters, their gradients and
// the optimizer's state per element (AdamW 2, SGD with momentum 1, without
// 0), the frozen weights and buffers whole; at stage 3 the largest of the
// sharding units `units` (parallel::DdpOptions::units) or the parameters outside
// them, at stage 2 two buckets of `bucketCapMb`. Computed before the engine
// allocates anything, so that a state that cannot fit fails before it is
// half built.
// `byUnit`: the model is built unit by unit (train/detail/units.h), so no
// step holds it whole, and its frozen weights (model.lora's base) are held
// in parts as the trainable ones, gathered with their unit.
StateBytes stateBytes(const torch::nn::Module& model, int stage, int world,
                      const std::vector<std::string>& units, const OptimizerConfig& optimizer,
                      double bucketCapMb, bool byUnit = false);

// Throws ConfigError naming the rank, the stage, the bytes and the limit's
// source when `need` exceeds the limit's share of one of `localRanks`;
// returns a warning to log when it takes more than 80% of it, else "".
std::string checkStateFits(const StateBytes& need, const memory::Limit& limit, int localRanks,
                           int rank, int worldSize, int stage);

}  // namespace cohort::train::detail
