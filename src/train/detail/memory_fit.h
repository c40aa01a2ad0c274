#pragma once

// Whether a rank's training state can fit the memory it may use, checked before the optimizer allocates its state: the
// parameters, gradients and optimizer state this rank holds (with ZeRO, its
// parts; at stage 3 also one gathered unit's parameters and gradients)
// against the process's memory limit (core/memory_limit.h) shared by the
// ranks that live under it (MemoryShare). A lower bound: activations and LibTorch itself come on
// top, so passing proves nothing, but failing means the run cannot train.

#include <torch/nn/module.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cohort/comm/comm.h"
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
// source when `need` exceeds the limit's share of one of the `sharers`
// ranks that live under that limit; returns a warning to log when it takes
// more than 80% of it, else "".
std::string checkStateFits(const StateBytes& need, const memory::Limit& limit, int sharers,
                           int rank, int worldSize, int stage);

// The memory this rank may use: its limit (core/memory_limit.h) and how
// many ranks live under it. Ranks of one machine share its memory, and the
// memory cgroup they share (`cohort run` starts its ranks in its own); a
// rank in a cgroup of its own (Slurm's task/cgroup, a Kubernetes container
// per rank) has its limit to itself. Every rank gathers every rank's
// machine and limit's source (a collective: all ranks of `comm` call it).
struct MemoryShare {
  memory::Limit limit;
  int sharers = 1;  // ranks under `limit`, this one among them
  double bytes() const { return limit.bytes == 0 ? 0.0 : double(limit.bytes) / std::max(1, sharers); }
  // "800 MB (SOURCE) for 1 rank" and the like, for logs.
  std::string describe() const;
};
MemoryShare memoryShare(const comm::Comm& comm);

}  // namespace cohort::train::detail
