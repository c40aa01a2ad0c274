#pragma once

// Reading, overriding, checking and writing job files.

#include <map>
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
// the result gives back the same job, except for credentials inside URLs
// (a SAS token as a blob URL's query string), which are left out: job.yaml,
// `cohort validate` and checkpoint manifests never hold a secret.
std::string toYaml(const JobConfig& job);

// Throws ConfigError naming distribution.pipeline.stages when the job cannot
// run on `ranks` ranks: its pipeline's stages do not divide them. (The
// number of ranks is known only where they start: `cohort run --procs`,
// an external launcher.)
void checkRanks(const JobConfig& job, int64_t ranks);

// Credentials inside the job's URLs: the URL without its query string -> the
// query string (without '?'). Any query of an az://, http:// or https:// value
// counts: storage accepts none but a SAS token.
using UrlCredentials = std::map<std::string, std::string>;

// Removes the query string of every URL in `job` and returns them.
UrlCredentials takeUrlCredentials(JobConfig& job);

// Puts credentials back on the URLs they were taken from (a URL that has a
// query string of its own keeps it).
void restoreUrlCredentials(JobConfig& job, const UrlCredentials& credentials);

// How `cohort run` hands credentials to its ranks (an environment variable,
// never a file or an argument). decode throws ConfigError naming `origin`
// without quoting the text.
std::string encodeUrlCredentials(const UrlCredentials& credentials);
UrlCredentials decodeUrlCredentials(const std::string& text, const std::string& origin);

// A stable hash of the resolved job (hex), to check that ranks agree and
// that a rerun is the same job. Keys that only change how the run is watched
// (output.progress, tensorboard, timeline, metrics_*; distribution.heartbeat_s,
// stall_*, straggler_factor) are left out of it.
std::string jobHash(const JobConfig& job);

// Where `cohort plan` keeps its report for `job` (resolved on the ranks it
// predicts): <output.dir>/plans/<jobHash>.json. A run of that very job finds
// it there and sets the prediction beside its figures in summary.json.
std::string savedPlanPath(const JobConfig& job);

// The keys whose values differ between a resolved job saved as YAML (as
// toYaml wrote it) and `job`, in schema order. Keys only one side has are
// listed too (the other side's value is "(none)"), but for a key `before`
// lacks that `job` has at its default (a key added since: the same job).
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
