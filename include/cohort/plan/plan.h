#pragma once

// `cohort plan`: memory, speed and cost of a job, predicted before it runs,
// from a few steps of the real model measured on this machine (docs/plan.md).
//
//   probes     `cohort run` of the job for a few steps on one rank, at two
//              micro-batches (and with model.recompute the other way), and
//              on two local ranks; `cohort health` on two local ranks for
//              the link's bandwidth and latency (Gloo over TCP)
//   fit        Fit: the memory a rank holds besides its training state
//              (LibTorch, the loader), activations per sample, compute per
//              sample and per step, the exchange's cost
//   predict    predictMemory / predictSpeed / predictCost for a Setting:
//              ZeRO stage, micro-batch and accumulation, recompute, nodes x
//              ranks per node, threads, bucket size
//
// This header does not include LibTorch.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/config/job.h"
#include "cohort/train/state_memory.h"

namespace cohort::plan {

// The most ranks a plan predicts for (nodes x ranks per node).
inline constexpr int64_t kMaxRanks = int64_t{1} << 20;

// What the plan varies; the rest of the job stays as written.
struct Setting {
  int64_t nodes = 1;
  int64_t procsPerNode = 1;
  int64_t threads = 1;         // intra-op threads per rank
  int64_t zero = 0;            // distribution.zero
  int64_t batchSize = 1;       // training.batch_size: per rank and micro-step
  int64_t accumulate = 1;      // training.accumulate_steps
  bool recompute = false;      // model.recompute: blocks
  MemoryLayout memoryFormat = MemoryLayout::automatic;  // model.memory_format
  double bucketCapMb = 25;     // distribution.bucket_cap_mb
  // A split model (the GPT): pipeline stages and their micro-batches per
  // round and schedule, the tensor split and sequence parallelism.
  int64_t stages = 1;
  int64_t microBatches = 1;    // with stages > 1
  bool gpipe = false;
  int64_t tensor = 1;
  bool sequenceParallel = false;

  int64_t ranks() const { return nodes * procsPerNode; }
  int64_t replicas() const { return std::max<int64_t>(1, ranks() / (stages * tensor)); }
  bool split() const { return stages > 1 || tensor > 1; }
  // The job's own setting, on `nodes` x `procsPerNode` ranks with `cores`
  // per machine (threads: distribution.threads_per_rank, else cores / ranks).
  static Setting of(const JobConfig& job, int64_t nodes, int64_t procsPerNode, int64_t cores);
  // The `--set` overrides that give a job this setting.
  std::vector<std::string> overrides() const;
  // "zero 2, batch 16 x 2, recompute, 2 x 1 ranks x 2 threads, buckets 25 MB".
  std::string describe() const;
};

// The link between machines (between a machine's ranks: shared memory).
struct Link {
  double gbps = 0;        // bandwidth, 10^9 bits/s
  double latencyUs = 0;   // one message's latency
  std::string source;     // "given" | "measured between local ranks (Gloo over TCP)"
};

// What the probes measured, fitted (docs/plan.md, "The model").
struct Fit {
  train::ModelElements elements;  // of the whole model
  int64_t epochSamples = 0;       // training samples per epoch
  int64_t blockSize = 0;          // a language model's tokens per sample; 0 otherwise
  // Memory (MB): resident memory besides the training state and the
  // activations (LibTorch, kernels' workspace, the loader's batches); the
  // activations per sample of a micro-batch, with and without recompute
  // (0 when not measured: the model has no blocks to recompute); what a
  // rank of several holds beyond that (the exchange's buckets and shared
  // memory, gathered units beyond the state's count, the heap they leave
  // behind), per MB of gradients, measured at ZeRO stage `exchangeStage`.
  double baseMb = 0;
  double activationMbPerSample = 0;
  double recomputeActivationMbPerSample = 0;
  double exchangeMbPerGradientMb = 0;
  int64_t exchangeStage = 0;
  // Speed (ms, at `threads` intra-op threads per rank): a micro-step's time
  // per sample, with and without recompute; a step's fixed time (optimizer,
  // bookkeeping); the share of a micro-step spent in backward (the window
  // the exchange hides in); the exchange between two local ranks, exposed,
  // per MB of gradients.
  int64_t threads = 1;
  double msPerSample = 0;
  double recomputeMsPerSample = 0;
  double msPerStep = 0;
  double backwardShare = 0.6;
  double localExchangeMsPerMb = 0;
  // Compute of ranks that share a machine against one rank alone (>= 1).
  double sharedMachineSlowdown = 1;
  Link link;
  bool measuredRecompute = false;
  // A split model, fitted from a probe of the split on this machine's
  // ranks (1 when not probed): the tensor split's exchanges, exposed, per
  // MB its sums carry; measured activations of a tensor split's rank
  // against the model's count; a pipeline's step against the model's.
  double tensorExchangeMsPerMb = 0;
  double tensorActivationFactor = 1;
  double pipelineFactor = 1;
  // What a pipeline stage's rank held beyond the count (the activations it
  // received and keeps for backward, the send and receive buffers), MB.
  double pipelineExtraMb = 0;
  std::string splitProbe;      // what calibrated the split ("" : nothing)
  // Utilization (models/flops.h, health/ceiling.h), as the probe's
  // summary.json reported them: the model's FLOPs per training sample and
  // the GEMM ceiling of a rank of `ceilingThreads` threads (0: not known).
  double modelFlopsPerSample = 0;
  double ceilingGflops = 0;
  int64_t ceilingThreads = 0;
  std::string ceilingDtype;
};

struct MemoryEstimate {
  train::StateBytes state;     // bytes
  double baseMb = 0, activationsMb = 0, exchangeMb = 0;
  double peakMb = 0;           // per rank (the largest of a pipeline's stages)
  double limitMb = 0;          // per rank; 0: none known
  std::vector<double> stagePeakMb;  // a pipeline's: each stage's rank
  bool fits() const { return limitMb <= 0 || peakMb <= limitMb; }
};

struct SpeedEstimate {
  double computeMs = 0;        // micro-steps and the optimizer step
  double localExchangeMs = 0;  // exposed, between a machine's ranks
  double linkExchangeMs = 0;   // exposed, between machines
  double pipelineIdle = 0;     // a pipeline: the share of a stage's step it waits
  double tensorMbPerStep = 0;  // a tensor split: what its sums carry per step and rank
  double tensorExchangeMs = 0; // exposed
  double stepMs = 0;
  double samplesPerSecond = 0; // all ranks
  double efficiency = 1;       // weak scaling: one rank's step time / this step time
  // Model FLOP/s of a rank at samplesPerSecond, and that against the GEMM
  // ceiling of its threads (0: not known; the ceiling is the probe's, so a
  // setting of other threads has none).
  double modelGflopsPerRank = 0;
  double mfu = 0;
};

// The utilization of `e` for setting `s` (SpeedEstimate's last two fields).
void addUtilization(const Fit& fit, const Setting& s, SpeedEstimate& e);

struct CostEstimate {
  int64_t steps = 0;           // to the job's end (training.epochs, capped by max_steps)
  double hours = 0;
  double nodeHours = 0;
  double price = 0;            // nodeHours x price per node-hour; 0 without a price
};

MemoryEstimate predictMemory(const Fit& fit, const JobConfig& job, const Setting& s, double limitMb);
SpeedEstimate predictSpeed(const Fit& fit, const JobConfig& job, const Setting& s);
CostEstimate predictCost(const Fit& fit, const JobConfig& job, const Setting& s, const SpeedEstimate& speed,
                         double pricePerNodeHour);

// The nearest settings that fit when `s` does not, nearest first: model.recompute,
// a higher ZeRO stage, a smaller micro-batch with more accumulation (the
// global batch kept), more ranks at stage 3. Empty when none of them fits.
std::vector<Setting> fittingAlternatives(const Fit& fit, const JobConfig& job, const Setting& s, double limitMb);

// --- `cohort plan JOB [options]` -------------------------------------------

struct PlanOptions {
  std::string jobPath;
  std::vector<std::string> overrides;  // --set
  // As typed, checked by runPlan: positive numbers (empty: the job's or measured).
  std::string nodes, procsPerNode, memoryPerRank, pricePerNodeHour, linkGbps, linkLatencyUs,
      coresPerNode;
  int64_t probeSteps = 6;          // steps per probe (the first two are not timed)
  double probeTimeoutS = 900;      // per probe
  bool json = false;
  bool tune = false;
  std::string tuneOutput;          // --tune: the job file written (default: JOB's name + .tuned.yaml)
  std::string workDir;             // where probes run (default: a temporary directory, removed)
  std::string executable;          // cohort binary for the probes; empty: this one
};

// Measures, predicts and prints (a table, or JSON with --json); with
// --tune also tries candidates and writes the fastest job that fits.
// Returns 0; throws UsageError / ConfigError (exit 2) for bad options and a
// job that fits at no setting (naming the closest one).
int runPlan(const PlanOptions& options, std::ostream& out);

// Parses a positive number given as `--name value`; throws UsageError
// naming the option otherwise.
double positiveNumber(const std::string& name, const std::string& value);
int64_t positiveCount(const std::string& name, const std::string& value);

}  // namespace cohort::plan
