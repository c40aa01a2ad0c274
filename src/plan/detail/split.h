#pragma once

// A split model in `cohort plan` (docs/plan.md, "Pipelines and tensor
// splits"): how a GPT's elements, activations and compute fall to the ranks
// of a pipeline's stages and of a tensor split, counted from the model's
// shape and what the probes measured of the whole model.

#include <vector>

#include "cohort/plan/plan.h"

namespace cohort::plan::detail {

// One rank of stage s (of the tensor split's T, all alike).
struct StageShare {
  int64_t blocks = 0;
  train::ModelElements elements;  // this rank's
  double activationShare = 0;     // of the whole model's activations per sample
  double computeShare = 0;        // of the whole model's compute per sample
  int64_t inFlight = 1;           // micro-batches whose activations it holds at once
  double tensorMbPerSample = 0;   // its tensor split's sums per sample (forward and backward)
};

// Every stage of `s` (one when it has no pipeline). Throws ConfigError for
// a split of a model that is not a GPT.
std::vector<StageShare> stageShares(const Fit& fit, const JobConfig& job, const Setting& s);

// The blocks of each stage: the job's split when it gives one for these
// stages, else as even as they go (the first stages one more).
std::vector<int64_t> stageBlocks(const JobConfig& job, int64_t stages);

}  // namespace cohort::plan::detail

namespace cohort::plan::detail {

// predictMemory / predictSpeed of a split setting (s.split()).
MemoryEstimate predictSplitMemory(const Fit& fit, const JobConfig& job, const Setting& s, double limitMb);
SpeedEstimate predictSplitSpeed(const Fit& fit, const JobConfig& job, const Setting& s);

}  // namespace cohort::plan::detail

#include "plan/detail/probe.h"

namespace cohort::plan::detail {

// Fits fit's split figures to probes of the split on this machine (either
// may be null): `tensor`, a tensor split's exchanges and activations;
// `pipeline`, a pipeline's step against the model's count.
void calibrateSplit(Fit& fit, const JobConfig& job, const ProbeRun* tensor, const ProbeRun* pipeline);

}  // namespace cohort::plan::detail
