#pragma once

// `cohort run`: validate the job, create the run directory, host the
// rendezvous store (a c10d TCPStore on a free port), start one `cohort
// worker` child per rank with torchrun's environment, and watch them.
//
// When a rank fails (non-zero exit or a signal) the launcher sends SIGTERM to
// the others, SIGKILLs whatever is left after a grace period, and, up to
// distribution.max_restarts times, starts every rank again; they resume from
// the newest valid checkpoint. A failure on bad input (exit 2) is not
// restarted. Otherwise it returns 1 naming the rank and its exit code or
// signal. SIGTERM to the launcher (a preemption notice) asks every rank to
// checkpoint and stop (exit 75); SIGINT stops them at once. Each child dies
// with the launcher (PR_SET_PDEATHSIG), so no rank outlives it.
//
// Without --run-dir, the newest run directory of the same job (same resolved
// job file) that did not complete and holds a checkpoint is resumed, unless
// --new-run.

#include <chrono>
#include <string>
#include <vector>

#include "cohort/launch/debug.h"

namespace cohort::run {

struct LaunchOptions {
  std::string jobPath;
  std::vector<std::string> overrides;  // --set key.path=value
  std::string runDir;                  // empty: <output.dir>/<name>-<UTC time>
  int procs = 0;                       // > 0 overrides distribution.procs_per_node
  std::string resume;                  // --resume: checkpoint to start from
  bool newRun = false;                 // --new-run: never resume an interrupted run
  std::string executable;              // cohort binary for the ranks; empty: launch::engineExecutable()
  std::string plan;                    // --plan: `cohort plan --json` output, kept as <run>/plan.json
  std::chrono::milliseconds termGrace{5000};  // SIGTERM -> SIGKILL
  launch::DebugOptions debug;          // --debug, --debug-on-failure (launch/debug.h)
};

// Returns the exit code: 0 when every rank succeeded, 1 when a rank failed
// (2 when it failed on bad input), 75 when the ranks stopped on SIGTERM after
// a checkpoint, 128 + signal when interrupted. Throws
// ConfigError/DataError for a bad job before any rank starts.
int runLauncher(const LaunchOptions& options);

}  // namespace cohort::run
