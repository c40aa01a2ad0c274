#pragma once

// `cohort run`: validate the job, create the run directory, host the
// rendezvous store (a c10d TCPStore on a free port), start one `cohort
// worker` child per rank with torchrun's environment, and watch them.
//
// When a rank fails (non-zero exit or a signal) the launcher sends SIGTERM to
// the others, SIGKILLs whatever is left after a grace period, and returns 1
// naming the rank and its exit code or signal. SIGINT/SIGTERM to the launcher
// stop every rank the same way. Each child dies with the launcher
// (PR_SET_PDEATHSIG), so no rank outlives it.

#include <chrono>
#include <string>
#include <vector>

namespace cohort::launch {

struct LaunchOptions {
  std::string jobPath;
  std::vector<std::string> overrides;  // --set key.path=value
  std::string runDir;                  // empty: <output.dir>/<name>-<UTC time>
  int procs = 0;                       // > 0 overrides distribution.procs_per_node
  std::string executable;              // cohort binary for the ranks; empty: this one
  std::chrono::milliseconds termGrace{5000};  // SIGTERM -> SIGKILL
};

// Returns the exit code: 0 when every rank succeeded, 1 when a rank failed
// (2 when it failed on bad input), 128 + signal when interrupted. Throws
// ConfigError/DataError for a bad job before any rank starts.
int runLauncher(const LaunchOptions& options);

}  // namespace cohort::launch
