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
#include "cohort/train/state_memory.h"

namespace cohort::train::detail {

using train::ModelElements;
using train::StateBytes;

// The elements of `model` (its part, or the shapes of it; tied tensors
// once), with the ZeRO stage 3 sharding units `units`
// (parallel::DdpOptions::units; none below stage 3).
ModelElements countElements(const torch::nn::Module& model, const std::vector<std::string>& units);

// What each rank of `world` will hold of `model` at ZeRO `stage`
// (train::stateBytes). Computed before the engine allocates anything, so
// that a state that cannot fit fails before it is half built.
inline StateBytes stateBytes(const torch::nn::Module& model, int stage, int world,
                             const std::vector<std::string>& units, const OptimizerConfig& optimizer,
                             double bucketCapMb, bool byUnit = false) {
  return train::stateBytes(countElements(model, units), stage, world, optimizer, bucketCapMb, byUnit);
}

// Throws ConfigError naming the rank, the stage, the bytes and the limit's
// source when `need` exceeds the limit's share of one of `localRanks`;
// returns a warning to log when it takes more than 80% of it, else "".
std::string checkStateFits(const StateBytes& need, const memory::Limit& limit, int localRanks,
                           int rank, int worldSize, int stage);

}  // namespace cohort::train::detail
