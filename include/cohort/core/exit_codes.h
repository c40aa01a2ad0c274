#pragma once

// Process exit codes shared by a rank (`cohort worker`), the launcher
// (`cohort run`) and the tools that supervise them. Errors map to theirs
// through cohort::Error::exitCode() (error.h): 2 for bad input, 1 otherwise.

namespace cohort {

// A rank (and `cohort run`) that stopped on request after writing a
// checkpoint: rerunning the same command resumes (EX_TEMPFAIL).
inline constexpr int kExitStoppedAfterCheckpoint = 75;

// A rank under `cohort agent` that stopped for a re-form with its state
// kept in the node's memory (elastic.state_dir): the agent starts the ranks
// again at the new size, and they take that state up.
inline constexpr int kExitStateHeld = 76;

// A rank under `cohort agent` whose node the others declared lost (cut off
// or stopped for longer than elastic.node_timeout_s) and went on without:
// it wrote nothing more into the run and stopped (cohort/core/fence.h). Not
// a failure: its agent rejoins the job.
inline constexpr int kExitFenced = 77;

// A process ended by signal `sig` reports 128 + sig, as a shell does.
constexpr int exitCodeForSignal(int sig) { return 128 + sig; }

}  // namespace cohort
