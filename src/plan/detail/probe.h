#pragma once

// The measurements `cohort plan` takes on this machine: a few steps of the
// real job through `cohort run` (each probe a process of its own, so its
// peak resident memory is the job's alone), and the allreduce between two
// local ranks through `cohort health`. Then the fit of plan::Fit to them.

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/plan/plan.h"

namespace cohort::plan::detail {

// One probe: `cohort run` of a setting on this machine (one node).
struct ProbeRun {
  Setting setting;
  std::string runDir;
  double peakRssMb = 0;         // rank 0's
  double stepMs = 0;            // median wall time of a step after the first two
  double samplesPerSecond = 0;  // all ranks, from stepMs
  // summary.json's phase_ms_per_step (means over every step).
  double forwardMs = 0, backwardMs = 0, optimizerMs = 0, exposedCommMs = 0, dataWaitMs = 0;
  bool elementsKnown = false;
  train::ModelElements elements;
  int64_t epochSamples = 0;
  // summary.json's utilization: the model's FLOPs per training sample and
  // the GEMM ceiling of the probe's threads (0: not known).
  double modelFlopsPerSample = 0;
  double ceilingGflops = 0;
  int64_t ceilingThreads = 0;
  std::string ceilingDtype;
};

class Prober {
 public:
  // Probes run `executable` on `jobPath` with `overrides`, in directories
  // under `workDir`, for `steps` steps each, and are ended after
  // `timeoutS`.
  Prober(std::string executable, std::string jobPath, std::vector<std::string> overrides,
         std::string workDir, int64_t steps, double timeoutS);

  // Runs `s` (one node: s.nodes is ignored) as probe `name`. Throws
  // DataError naming the probe, its setting and the tail of its log when
  // it fails.
  ProbeRun run(const Setting& s, const std::string& name);

  // The allreduce between two local ranks over Gloo at two sizes: latency
  // and bandwidth of t(bytes) = 2 latency + bytes / bandwidth.
  Link measureLink();

  // Probes run so far.
  int runs() const { return runs_; }

 private:
  // Runs argv with stdout to `out`, stderr to `log`; returns the exit
  // status, or throws TimeoutError after timeoutS (the process is ended).
  int execute(const std::vector<std::string>& argv, const std::string& out, const std::string& log,
              const std::string& what);

  std::string exe_, job_;
  std::vector<std::string> overrides_;
  std::string workDir_;
  int64_t steps_;
  double timeoutS_;
  int runs_ = 0;
};

// The measurements the plan fits: `a` the job's setting on one rank; `b` the
// same at another micro-batch; `c` (optional, null) with model.recompute the
// other way; `d` (optional) on two local ranks.
struct Probes {
  const ProbeRun* a = nullptr;
  const ProbeRun* b = nullptr;
  const ProbeRun* c = nullptr;
  const ProbeRun* d = nullptr;
};
Fit fitProbes(const JobConfig& job, const Probes& p, const Link& link);

}  // namespace cohort::plan::detail
