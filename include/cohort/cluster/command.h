#pragma once

// Running a scheduler's client (sbatch, squeue, sacct, scancel, scontrol)
// and reading what it printed: one bounded call, no shell between.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace cohort::cluster {

struct CommandResult {
  int exitCode = -1;  // -1: killed by a signal, or stopped at the time limit
  bool timedOut = false;
  std::string out;    // stdout
  std::string err;    // stderr
  // "sbatch exited with code 1: sbatch: error: invalid partition ..." for messages.
  std::string describe(const std::string& program) const;
};

// The path of `program` on PATH, or nullopt.
std::optional<std::string> findOnPath(const std::string& program);

// Runs argv (argv[0] found on PATH) with stdin from /dev/null and waits at most
// `limit`; a command still running then is SIGKILLed and reported as timed
// out. Throws UsageError (exit 2) naming the program when it is not on PATH.
CommandResult runCommand(const std::vector<std::string>& argv,
                         std::chrono::milliseconds limit = std::chrono::seconds(60));

}  // namespace cohort::cluster
