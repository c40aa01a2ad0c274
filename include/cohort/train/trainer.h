#pragma once

// The training loop of one rank: forward, backward with gradient exchange,
// optimizer step, LR schedule, evaluation, metrics and progress.

#include <cstdint>
#include <string>

#include "cohort/comm/comm.h"
#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/monitor/metrics.h"

namespace cohort::train {

struct TrainSummary {
  int64_t epochs = 0;       // epochs completed
  int64_t steps = 0;        // optimizer steps
  int64_t images = 0;       // training images, all ranks
  double seconds = 0;       // wall time of the training loop (including evaluation)
  double imagesPerS = 0;    // training images per second, all ranks
  double dataWaitFrac = 0;  // mean over ranks
  int64_t parameters = 0;
  bool evaluated = false;
  monitor::EvalRecord lastEval;
  double bestTop1 = 0;
  double peakLr = 0;
  int64_t globalBatch = 0;
};

// Trains the job's model on this rank. Every rank must call it with the same
// job. Rank 0 writes metrics.jsonl and model/final.pt into `runDir`.
// Throws cohort::Error subclasses (DataError for bad data, CommError when a
// peer fails).
TrainSummary train(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir);

// Writes summary.json (rank 0).
void writeSummary(const JobConfig& job, const TrainSummary& s, const RunDir& runDir,
                  int worldSize);

}  // namespace cohort::train
