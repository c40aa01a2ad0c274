#pragma once

// The training loop of one rank: forward, backward with gradient exchange,
// optimizer step, LR schedule, evaluation, metrics and progress.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/ckpt/checkpointer.h"
#include "cohort/comm/comm.h"
#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/health/ceiling.h"
#include "cohort/models/flops.h"
#include "cohort/monitor/metrics.h"
#include "cohort/parallel/mesh.h"
#include "cohort/train/compute.h"
#include "cohort/train/state_memory.h"

namespace cohort::train {

// Where rank 0's training time went, summed over the run (seconds).
struct PhaseTimes {
  double dataWait = 0;     // waiting for the next batch
  double forward = 0;      // forward and loss
  double backward = 0;     // backward; bucket allreduces overlap it
  double exposedComm = 0;  // the exchange not hidden under backward: finishGradients, and
                           // shared-memory exchanges (synchronous, inside backward)
  double optimizer = 0;    // optimizer step and zeroing the gradients
  // A pipeline (distribution.pipeline): blocked on a neighbouring stage's
  // activations or gradients, and moving them (inside forward and backward).
  double pipelineWait = 0;
  double pipelineTransfer = 0;
  int64_t steps = 0;
};

struct TrainSummary {
  int64_t epochs = 0;       // epochs completed
  int64_t steps = 0;        // optimizer steps
  int64_t images = 0;       // training images, all ranks
  double seconds = 0;       // wall time of the training loop (including evaluation)
  double imagesPerS = 0;    // training images per second, all ranks
  double dataWaitFrac = 0;  // mean over ranks
  int64_t corruptSkipped = 0;  // undecodable training samples skipped, all ranks
  int64_t nonfiniteSkipped = 0;  // steps whose update was dropped (on_nonfinite: skip, or an overflow)
  int64_t recomputedForwards = 0;  // rank 0's (model.recompute), models::recomputations
  double lossScale = 0;          // training.loss_scale on: the last scale; 0: off
  std::vector<double> peakRssMbPerRank;  // each rank's peak resident MiB, by job rank (rank 0's summary)
  int64_t parameters = 0;
  int64_t trainableParameters = 0;  // model.lora: the adapters'; otherwise all
  std::string loraBaseDigest;       // model.lora: models::frozenDigest after training
  bool evaluated = false;
  monitor::EvalRecord lastEval;
  double bestTop1 = 0;
  double peakLr = 0;
  int64_t globalBatch = 0;
  int64_t stepsPerEpoch = 0;   // optimizer steps per epoch
  int64_t epochSamples = 0;    // training samples per epoch, all data ranks (padded to an even split)
  bool stopped = false;           // stopped on request after a checkpoint
  bool reformed = false;          // ... for a re-form, the state held in memory (`cohort agent`)
  int64_t resumedFromStep = -1;   // -1: started fresh
  std::string resumedFrom;        // the checkpoint directory
  int restartCount = 0;
  ckpt::CheckpointStats checkpoints;
  PhaseTimes phases;
  ComputeState compute;  // rank 0's, as training started
  // What rank 0 held at the end (distribution.zero divides the optimizer
  // state; docs/zero.md).
  struct Memory {
    int zeroStage = 0;
    int64_t parameterBytes = 0;       // trainable parameters, with ZeRO's padding
    int64_t gradientBytes = 0;        // gradient buckets
    int64_t optimizerStateBytes = 0;  // the optimizer's state tensors
    // Stage 3: the largest unit's parameters, and the most bytes of
    // gathered units (parameters, full gradients, receive buffers) held at once.
    int64_t largestUnitBytes = 0;
    int64_t unitPeakBytes = 0;
    // Stage 3 with model.lora: this rank's parts of the frozen base.
    int64_t frozenBytes = 0;
    // The whole model's elements (rank 0 held it whole: no pipeline, below
    // stage 3), from which `cohort plan` works out the state at any stage.
    bool elementsKnown = false;
    ModelElements elements;
  } memory;
  // A pipeline (distribution.pipeline): what each stage of data replica 0
  // measured, in stage order; empty without one.
  struct Stage {
    int64_t firstBlock = 0, endBlock = 0;  // its blocks [first, end)
    int64_t parameters = 0;                // parameter values it holds
    int64_t stateBytes = 0;                // its parameters, gradients and optimizer state
    double peakResidentMb = 0;             // its process's peak resident memory
    double idleFraction = 0;               // of its rounds, not computing (parallel::PipelineStats)
    double bubbleFraction = 0;             // the schedule's theory: (P-1)/(M+P-1)
    double recvSeconds = 0, endSeconds = 0, sendSeconds = 0, roundSeconds = 0;
    int64_t heldPeak = 0;                  // micro-batches whose activations it held at once
  };
  std::vector<Stage> stages;
  std::string schedule;  // the pipeline's (1f1b, gpipe)
  int64_t microBatches = 0;
  // A tensor split (distribution.tensor): what rank 0's exchanges carried
  // per step (Plan::splitStats), beside what Megatron's count expects of
  // the blocks (summary.json "tensor"); null without one.
  nlohmann::json tensor;
  // Model FLOPs utilization: the model's FLOPs per training sample
  // (models/flops.h) and rank 0's GEMM ceiling (health/ceiling.h), which
  // achieved throughput is measured against.
  struct Utilization {
    models::ModelFlops flops;
    std::optional<health::GemmCeiling> ceiling;
    std::string why;  // no ceiling: why
  } utilization;
};

struct TrainOptions {
  // A verified checkpoint directory to resume from; empty: start fresh.
  std::string resumeFrom;
  // Restarts of the job so far (COHORT_RESTART_COUNT); faults are injected
  // in the first attempt only.
  int restartCount = 0;
};

// Trains the job's model on this rank. Every rank must call it with the same
// job, on the mesh built from it (meshShape). Rank 0 writes metrics.jsonl and
// model/final.pt into `runDir`. Throws cohort::Error subclasses (DataError
// for bad data, CommError when a peer fails).
//
// With checkpoint.enabled, checkpoints are taken as the job says, and a
// stopRequest() (SIGTERM) ends training at an agreed step boundary after a
// checkpoint that is durable (summary.stopped).
TrainSummary train(const JobConfig& job, const parallel::Mesh& mesh, const RunDir& runDir,
                   const TrainOptions& options = {});
// The same, building the mesh over `comm` first (collective).
TrainSummary train(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir,
                   const TrainOptions& options = {});

// The mesh the job asks for (distribution.pipeline).
parallel::MeshShape meshShape(const JobConfig& job);

// Writes summary.json (rank 0).
void writeSummary(const JobConfig& job, const TrainSummary& s, const RunDir& runDir,
                  int worldSize);

}  // namespace cohort::train
