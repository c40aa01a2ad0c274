#pragma once

// One rank, start to finish: read the environment (torchrun, OpenMPI or
// Slurm variables), load the job, join the process group, agree on the job
// and the run directory, set up logging, train, write the outputs.

#include <string>
#include <vector>

namespace cohort::train {

struct WorkerOptions {
  std::string jobPath;
  std::vector<std::string> overrides;  // --set key.path=value
  std::string runDir;                  // empty: rank 0 creates the default one
  std::string resume;                  // --resume: checkpoint, checkpoints or run directory
};

// Runs this rank and returns its exit code: 0 when training completed,
// kExitStoppedAfterCheckpoint (75) when it stopped on SIGTERM after writing
// a checkpoint. Throws cohort::Error subclasses (exitCode() tells the process
// exit status). A rank resumes from the newest valid checkpoint of its run
// directory, or else from options.resume. SIGINT, a SIGTERM before training
// started or with checkpoints disabled, and a second SIGTERM end the rank at
// once with exit status 128 + signal, after flushing its log.
int runWorker(const WorkerOptions& options);

}  // namespace cohort::train
