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
};

// Runs this rank. Returns on success; throws cohort::Error subclasses
// (exitCode() tells the process exit status). SIGINT/SIGTERM end the rank
// promptly with exit status 128 + signal, after flushing its log.
void runWorker(const WorkerOptions& options);

}  // namespace cohort::train
