#pragma once

// Model FLOPs utilization of a training run: the model's FLOPs per sample
// (models/flops.h) times the samples per second, per rank, against the
// GEMM ceiling of a rank's threads and dtype (health/ceiling.h).

#include <string>

#include <nlohmann/json.hpp>

#include "cohort/comm/comm.h"
#include "cohort/config/job.h"
#include "cohort/train/precision.h"
#include "cohort/train/trainer.h"

namespace cohort::train::detail {

using Utilization = TrainSummary::Utilization;

// Counts the model's FLOPs (`model` resolved against the data, images of
// height x width) and, on rank 0, looks up the ceiling for `precision` and
// the rank's threads (`compute`), measuring it when the machine's cache
// lacks it while the other ranks wait at a barrier (collective: every rank
// calls it; the ceiling is rank 0's only). On a busy machine (machineBusy)
// the measurement serves this run only.
Utilization measureUtilization(const ModelConfig& model, int64_t height, int64_t width, Precision precision,
                               const ComputeState& compute, const comm::Comm& comm);

// The model FLOP/s of one rank at `samplesPerS` (all ranks), and that as a
// fraction of the ceiling; 0 when not known.
double modelFlopsPerRank(const Utilization& u, double samplesPerS, int worldSize);
double utilizationFraction(const Utilization& u, double samplesPerS, int worldSize);

// summary.json's "utilization" (docs/outputs.md).
nlohmann::json utilizationJson(const Utilization& u, double samplesPerS, int worldSize, int64_t globalBatch);

// "model 51.2 GFLOP/s per rank, 64.0% of the GEMM ceiling (80.1 GFLOP/s float32 x 1 thread)",
// or why it is not known.
std::string utilizationText(const Utilization& u, double samplesPerS, int worldSize);

}  // namespace cohort::train::detail
