#pragma once

// What `cohort submit --slurm` hands to Slurm: an sbatch script, written
// into the run directory so a user can read and adapt it.
//
// The script asks for the nodes, tasks, CPUs and GPUs of the job, starts one
// `cohort worker` per task with srun, and asks Slurm for SIGUSR2
// `warnSeconds` before the time limit (docs/slurm.md says why that signal).
// A rank that gets it finishes its step, writes a checkpoint and exits 75;
// with `requeue`, the script then puts the job back in the queue and the next
// start resumes from that checkpoint in the same run directory.
//
// Elastic (maxNodes > 0): `--nodes=MIN-MAX`, one `cohort agent` per node
// instead (docs/elastic.md), and `--no-kill`, so a node that fails leaves the
// others running: its agents re-form without it. The agents restart failed
// ranks themselves; SIGUSR2 or SIGTERM to them stops the whole job with a
// checkpoint (exit 75, requeued as above).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include <vector>

namespace cohort::cluster {

struct SlurmRequest {
  std::string jobName;
  int64_t nodes = 1;          // elastic: the fewest
  int64_t maxNodes = 0;       // > 0: elastic, nodes..maxNodes with an agent per node
  std::string rdzv;           // elastic: etcd://HOST:PORT[,...]; empty: the store of the first node's agent
  int64_t tasksPerNode = 1;
  int64_t cpusPerTask = 0;  // 0: not asked for (Slurm's default)
  int64_t gpusPerNode = 0;
  std::string partition;    // empty: the cluster's default
  std::string time;         // Slurm's time format ("30", "2:00:00", "1-0"); empty: default
  std::string account;
  bool requeue = false;
  int64_t warnSeconds = 120;  // SIGUSR2 this long before the time limit
  int64_t masterPort = 0;     // 0: a port free on the first node (`cohort free-port`)
  int64_t maxRestarts = 3;    // srun again after a failed attempt, this many times
  std::string cohortBinary;   // absolute path
  // One run directory per array task; one entry: no array.
  std::vector<std::string> runDirs;
  std::string outputFile;     // sbatch --output (%j, %A, %a allowed)
  // Variables every step gets (--debug: launch::debugEnvironment).
  std::vector<std::pair<std::string, std::string>> env;
};

// The script's text. Throws UsageError for a request Slurm could not take
// (no run directory, fewer than one node or task).
std::string sbatchScript(const SlurmRequest& request);

// The job id `sbatch --parsable` printed ("1234" or "1234;cluster").
// Throws Error when there is none.
std::string parseSubmittedJobId(const std::string& sbatchOutput);

// A word for a shell script: single-quoted unless it needs no quoting.
std::string shellQuote(const std::string& word);

}  // namespace cohort::cluster
