#pragma once

// `cohort submit JOB.yaml --slurm | --k8s`: hand a job to the scheduler of the
// cluster users already have (docs/slurm.md).
//
// --slurm: checks the job (and every sweep point) as `cohort validate` does,
// creates the run directory (a sweep: a directory holding one run directory
// per point), writes each point's resolved job.yaml and the sbatch script
// (slurm.h), submits it with `sbatch --parsable` and records the job id in
// slurm.json. A job Slurm refuses leaves nothing behind: the directories
// made for it are removed and sbatch's message is the error (exit 2).
//
// --k8s: writes an indexed Job manifest (k8s.h) into the run directory and
// prints it; nothing is submitted.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/launch/debug.h"

namespace cohort::cluster {

enum class Scheduler { slurm, k8s };

struct SubmitOptions {
  std::string jobPath;
  std::vector<std::string> overrides;  // --set
  std::vector<std::string> sweeps;     // --sweep key=v1,v2,...
  Scheduler scheduler = Scheduler::slurm;
  std::string runDir;  // empty: <output.dir>/<name>-<UTC time> (-sweep-<UTC time> for a sweep)
  // "N" overrides distribution.nodes; "MIN:MAX" is elastic training, one
  // `cohort agent` per node (slurm.h); empty: distribution.nodes.
  std::string nodes;
  std::string rdzv;    // elastic: etcd://HOST:PORT[,...]; empty: the first node's agent hosts it
  int64_t gpusPerNode = 0;
  std::string partition, time, account;
  bool requeue = false;
  bool dryRun = false;        // write everything, submit nothing
  int64_t warnSeconds = 0;    // SIGUSR2 before the time limit; 0: stop_timeout_s + 60
  std::string executable;     // the cohort binary the ranks run; empty: this one
  std::string image;          // --k8s: the container image holding cohort
  launch::DebugOptions debug;  // --debug, --debug-on-failure: passed to the ranks (launch/debug.h)
};

// Returns the exit code (0). Throws UsageError/ConfigError (exit 2) for a bad
// job, sweep or option, for a missing sbatch, and when Slurm refuses the job.
int runSubmit(const SubmitOptions& options, std::ostream& out);

}  // namespace cohort::cluster
