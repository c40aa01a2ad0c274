#pragma once

// What a rank reports while it trains: rank 0's outputs (metrics.jsonl,
// TensorBoard, the progress display) and the record every log_every steps,
// which every rank takes part in (one small allreduce of loss, throughput,
// data wait and each rank's compute time, for stragglers).

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "cohort/comm/comm.h"
#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/core/time.h"
#include "cohort/data/loader.h"
#include "cohort/monitor/metrics.h"
#include "cohort/monitor/progress.h"
#include "cohort/monitor/tensorboard.h"
#include "cohort/train/trainer.h"

namespace cohort::train::detail {

// One epoch of this rank, as endEpoch() reports it.
struct EpochTotals {
  double seconds = 0;
  double waitSeconds = 0;  // waiting for batches
  int64_t images = 0;      // this rank's
  int64_t steps = 0;
  double meanLoss = 0;     // over the epoch's finite micro-batch losses
};

class Reporter {
 public:
  // Rank 0 opens metrics.jsonl (appending), TensorBoard (output.tensorboard;
  // a failure only warns) and the progress display. `loader` and `phases`
  // are read for the data wait and compute time of each record.
  // `stages`: the ranks that train on each sample (a pipeline's stages
  // times a tensor split's ranks; 1 without), so that throughput counts
  // every sample once.
  // `utilization`, when given, turns throughput into model FLOPs
  // utilization in each record and the progress line.
  Reporter(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir,
           const data::BatchLoader& loader, const PhaseTimes& phases, int stages = 1,
           const TrainSummary::Utilization* utilization = nullptr);

  // A line of metrics.jsonl (rank 0; other ranks ignore it).
  void event(const nlohmann::json& line);
  // Scalars at `step` on TensorBoard. It is an optional output: a failure to
  // write (a full disk) stops it with a warning, not the training.
  void board(int64_t step, std::initializer_list<std::pair<const char*, double>> scalars);
  // An evaluation's record: metrics.jsonl and TensorBoard.
  void evaluation(const monitor::EvalRecord& r);

  // `steps`: the optimizer steps this epoch will take.
  void startEpoch(int64_t epoch, int64_t steps);
  // After each micro-batch's backward.
  void microBatch(double loss, int64_t images, int64_t skipped);
  // After optimizer step `step` (counted from 1) at learning rate `lr`: the
  // record when step % log_every == 0 (every rank must call it then),
  // otherwise the progress display.
  void stepDone(int64_t step, int64_t epoch, double lr);
  EpochTotals endEpoch();

 private:
  void record(int64_t step, int64_t epoch, double lr);
  void resetWindow();
  // Model FLOPs utilization at `samplesPerS`, all ranks; NaN when not known.
  double mfu(double samplesPerS) const;

  const JobConfig& job_;
  const comm::Comm& comm_;
  const data::BatchLoader& loader_;
  const PhaseTimes& phases_;
  const int stages_;
  const TrainSummary::Utilization* utilization_;
  std::unique_ptr<monitor::MetricsWriter> metrics_;
  std::unique_ptr<monitor::TensorBoardWriter> board_;
  std::unique_ptr<monitor::Progress> progress_;

  // The epoch so far.
  SteadyClock::time_point epochStart_;
  double epochWaitStart_ = 0;
  int64_t epochImages_ = 0, epochSteps_ = 0, epochLossCount_ = 0;
  double epochLossSum_ = 0;
  // Since the last record.
  SteadyClock::time_point windowStart_;
  double windowWaitStart_ = 0, windowLoss_ = 0, windowComputeStart_ = 0;
  int64_t windowMicro_ = 0, windowImages_ = 0, windowSkipped_ = 0, windowSteps_ = 0;
};

}  // namespace cohort::train::detail
