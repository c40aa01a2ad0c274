#pragma once

// Whether a rank's training state can fit the memory its machine's ranks
// may use, checked before the optimizer allocates its state: the
// parameters, gradients and optimizer state this rank holds (with ZeRO, its
// parts; at stage 3 also one gathered unit's parameters and gradients)
// against the process's memory limit (core/memory_limit.h) shared by the
// machine's ranks. A lower bound: activations and LibTorch itself come on
// top, so passing proves nothing, but failing means the run cannot train.

#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "cohort/config/job.h"
#include "cohort/core/memory_limit.h"

namespace cohort::train::detail {

struct StateBytes {
  double parameters = 0, gradients = 0, optimizer = 0, unit = 0;
  double total() const { return parameters + gradients + optimizer + unit; }
};

// What each rank of `world` will hold at ZeRO `stage` for the model's
// trainable parameters (float32; tied ones once), with the optimizer's
// state per element (AdamW 2, SGD with momentum 1, without 0) and, at stage
// 3, the largest of the sharding units `units` (ddp::DdpOptions::units) or
// the parameters outside them. Computed before the engine allocates
// anything, so that a state that cannot fit fails before it is half built.
StateBytes stateBytes(const torch::nn::Module& model, int stage, int world,
                      const std::vector<std::string>& units, const OptimizerConfig& optimizer);

// Throws ConfigError naming the rank, the stage, the bytes and the limit's
// source when `need` exceeds the limit's share of one of `localRanks`;
// returns a warning to log when it takes more than 80% of it, else "".
std::string checkStateFits(const StateBytes& need, const memory::Limit& limit, int localRanks,
                           int rank, int worldSize, int stage);

}  // namespace cohort::train::detail
