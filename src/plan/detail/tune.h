#pragma once

// `cohort plan --tune`: candidates around the job's setting, each run for a
// few steps on this machine when its predicted memory fits, the fastest
// kept (docs/plan.md, "Tuning").

#include <string>
#include <vector>

#include "plan/detail/probe.h"
#include "plan/detail/report.h"

namespace cohort::plan::detail {

struct Tried {
  Row predicted;             // at the target's node count
  bool ran = false;
  std::string note;          // why it did not run, or what failed
  double stepMs = 0;         // measured on one node, plus the predicted exchange between nodes
  double samplesPerSecond = 0;  // at the target's node count
  double peakRssMb = 0;      // measured, rank 0
};

struct TuneResult {
  Setting best;
  std::vector<Tried> tried;  // in the order tried; tried[0] is the job's own setting
  size_t bestIndex = 0;
};

// Coordinate search: ranks per machine against threads per rank, ZeRO
// stage, micro-batch against accumulation (the global batch kept),
// recompute, memory format (image models), bucket size, and a GPT's split
// (1 or 2 pipeline stages and their micro-batches, 1 or 2 tensor ranks, on
// the same ranks and the same global batch); along each in turn
// the fastest candidate that fits is kept. `localCores`: the cores a probe
// may use here.
TuneResult tune(Prober& prober, const Fit& fit, const JobConfig& job, const Setting& target, double limitMb,
                int64_t localCores);

// The table of what was tried, one line each, '#'-prefixed with `prefix`.
std::string tuneTable(const TuneResult& r, const Fit& fit, const std::string& prefix);

}  // namespace cohort::plan::detail
