#include "cluster.h"

#include <iostream>

#include "cohort/cluster/record.h"
#include "cohort/cluster/runs.h"
#include "cohort/core/error.h"
#include "cohort/core/net.h"
#include "common.h"

namespace cohort::cli {

void ClusterCommands::add(CLI::App& app) {
  cluster::SubmitOptions& o = submitOptions;
  submit = app.add_subcommand("submit", "Hand a job to the cluster's scheduler: a Slurm batch job (or array), "
                                        "or a Kubernetes manifest");
  submit->add_option("job", o.jobPath, "Job file (YAML)")->required();
  submit->add_flag("--slurm", slurm, "Submit with sbatch (the script is kept in the run directory)");
  submit->add_flag("--k8s", k8s, "Write and print a Kubernetes indexed Job for the job (not submitted)");
  submit->add_option("--set", o.overrides, "Override a job key: key.path=value (repeatable)")->take_all();
  submit->add_option("--sweep", o.sweeps,
                     "Sweep a job key: key.path=v1,v2,... (repeatable: the product); a Slurm job array, "
                     "one run directory per point")
      ->take_all();
  submit->add_option("--run-dir", o.runDir, "Run directory (a sweep: the directory of its runs)");
  submit->add_option("--nodes", o.nodes,
                     "Machines: N (overrides distribution.nodes), or MIN:MAX for elastic training, "
                     "one `cohort agent` per node (docs/elastic.md)");
  submit->add_option("--rdzv", o.rdzv,
                     "Elastic: the rendezvous on etcd, etcd://HOST:PORT[,HOST:PORT...] or etcds://... "
                     "over TLS (default: cohort's store, hosted by the first node's agent)");
  submit->add_option("--gpus-per-node", o.gpusPerNode, "GPUs to ask for on each machine");
  submit->add_option("--partition", o.partition, "Slurm partition");
  submit->add_option("--time", o.time, "Time limit, in Slurm's format (30, 2:00:00, 1-0)");
  submit->add_option("--account", o.account, "Slurm account to charge");
  submit->add_flag("--requeue", o.requeue,
                   "Back into the queue after a preemption, a node failure or the time limit; the "
                   "next start resumes from the newest checkpoint");
  submit->add_option("--signal-seconds", o.warnSeconds,
                     "SIGUSR2 to the ranks this long before the time limit (default "
                     "distribution.stop_timeout_s + 60)");
  submit->add_option("--image", o.image, "--k8s: container image holding cohort");
  submit->add_flag("--dry-run", o.dryRun, "Write the run directory and script; submit nothing");
  addDebugFlags(submit, o.debug);

  runs = app.add_subcommand("runs", "List runs (local or submitted) with state, step, best metric and time");
  runs->add_option("dir", dir, "A run directory, a sweep's directory or output.dir")->required();
  runs->add_flag("--no-slurm", noSlurm, "Do not ask Slurm about submitted runs (their files only)");
  status = app.add_subcommand("status", "Show a run's state; a submitted run's Slurm job too");
  status->add_option("run_dir", dir, "Run directory (or a sweep's)")->required();
  cancel = app.add_subcommand("cancel", "Cancel a submitted run's Slurm job (its ranks checkpoint and stop)");
  cancel->add_option("run_dir", dir, "Run directory (or a sweep's: the whole array)")->required();
  // For the batch script `submit --slurm` writes: the store's port on the first node.
  freePort = app.add_subcommand("free-port", "Print a TCP port free on this machine now");
  freePort->group("");
}

std::optional<int> ClusterCommands::dispatch() {
  if (*submit) {
    if (slurm == k8s) throw UsageError("cohort submit: say where: --slurm or --k8s");
    submitOptions.scheduler = slurm ? cluster::Scheduler::slurm : cluster::Scheduler::k8s;
    return cluster::runSubmit(submitOptions, std::cout);
  }
  if (*runs) return cluster::printRuns(dir, std::cout, !noSlurm);
  if (*status) return cluster::printStatus(dir, std::cout);
  if (*cancel) return cluster::cancelRun(dir, std::cout);
  if (*freePort) {
    std::cout << freeTcpPort() << "\n";
    return 0;
  }
  return std::nullopt;
}

int ClusterCommands::logs(const monitor::LogsOptions& options) {
  try {
    return monitor::printLogs(options, std::cout);
  } catch (const DataError& e) {
    std::optional<cluster::SlurmRecord> record;
    try {
      record = cluster::readSlurmRecord(options.runDir);
    } catch (const Error&) {
    }
    if (!record) throw;
    const cluster::SlurmState s = cluster::querySlurm(record->ref());
    const std::string where = s.state.empty() ? "no longer known to Slurm"
                                              : s.state + (s.reason.empty() ? "" : " (" + s.reason + ")");
    throw DataError(std::string(e.what()) + "; its Slurm job " + record->ref() + " is " + where +
                    ": Slurm's own output is in slurm-*.out beside the logs");
  }
}

}  // namespace cohort::cli
