#pragma once

// Reading, overriding, checking and writing job files.

#include <string>
#include <vector>

#include "cohort/config/job.h"

namespace cohort {

// Parses and validates a job file. `overrides` are "key.path=value" strings
// (the command line's --set), applied on top of the file with the same
// checks. Every default is filled in; relative data paths are made absolute
// (relative to the current directory).
//
// Throws ConfigError naming file:line:column (or the --set option) for an
// unknown key (with a did-you-mean), a wrong type or an out-of-range value,
// and DataError naming the path for a data file that does not exist.
JobConfig loadJob(const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from YAML text; `origin` names it in messages.
JobConfig loadJobFromString(const std::string& yaml, const std::string& origin,
                            const std::vector<std::string>& overrides = {});

// The resolved job as YAML: every key with its value. loadJobFromString of
// the result gives back the same job.
std::string toYaml(const JobConfig& job);

// A stable hash of the resolved job (hex), to check that ranks agree and
// that a rerun is the same job. Keys that only change how the run is watched
// (output.progress, tensorboard, timeline, metrics_*; distribution.heartbeat_s,
// stall_*, straggler_factor) are left out of it.
std::string jobHash(const JobConfig& job);

// The keys whose values differ between a resolved job saved as YAML (as
// toYaml wrote it) and `job`, in schema order. Keys only one side has are
// listed too (the other side's value is "(none)").
struct JobChange {
  std::string key;
  std::string before;
  std::string after;
};
std::vector<JobChange> diffJobs(const std::string& beforeYaml, const JobConfig& job);

// Every key path of the schema ("training.optimizer.lr", ...) with its
// one-line description, in declaration order.
struct KeyDoc {
  std::string path;
  std::string type;
  std::string defaultValue;
  std::string description;
};
std::vector<KeyDoc> describeJobKeys();

}  // namespace cohort
