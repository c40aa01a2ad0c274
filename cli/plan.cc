#include "plan.h"

#include <iostream>

namespace cohort::cli {

void PlanCommand::add(CLI::App& app) {
  plan::PlanOptions& o = options;
  plan = app.add_subcommand("plan", "Predict a job's memory per rank, speed and cost on N machines from a few "
                                    "measured steps; --tune writes the fastest setting that fits (docs/plan.md)");
  plan->add_option("job", o.jobPath, "Job file (YAML)")->required();
  plan->add_option("--set", o.overrides, "Override a job key: key.path=value (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  plan->add_option("--nodes", o.nodes, "Machines (default distribution.nodes)");
  plan->add_option("--procs-per-node", o.procsPerNode, "Ranks per machine (default distribution.procs_per_node)");
  plan->add_option("--cores-per-node", o.coresPerNode, "Cores of each machine (default: this machine's)");
  plan->add_option("--memory-per-rank", o.memoryPerRank,
                   "Memory each rank may use: 8G, 4096M (default: this machine's limit / ranks per machine)");
  plan->add_option("--price-per-node-hour", o.pricePerNodeHour, "Price of one machine for an hour");
  plan->add_option("--link-gbps", o.linkGbps,
                   "Bandwidth between machines, Gbit/s (default: measured between two local ranks)");
  plan->add_option("--link-latency-us", o.linkLatencyUs,
                   "Latency between machines, microseconds (default: measured between two local ranks)");
  plan->add_option("--probe-steps", o.probeSteps, "Steps per measured run (default 6; the first two are not timed)");
  plan->add_option("--probe-timeout", o.probeTimeoutS, "Seconds a measured run may take (default 900)");
  plan->add_option("--work-dir", o.workDir, "Keep the measured runs here (default: a temporary directory, removed)");
  plan->add_flag("--json", o.json, "Print JSON (for scripts, and for `cohort run --plan`)");
  plan->add_flag("--tune", o.tune,
                 "Try settings around the job's (ranks vs threads, ZeRO stage, micro-batch, recompute, memory "
                 "format, bucket size) and write the fastest that fits");
  plan->add_option("--output", o.tuneOutput, "--tune: the job file to write (default: JOB.tuned.yaml)");
}

std::optional<int> PlanCommand::dispatch() {
  if (!*plan) return std::nullopt;
  // Given but empty is not "not given".
  for (const char* name : {"--nodes", "--procs-per-node", "--cores-per-node", "--memory-per-rank",
                           "--price-per-node-hour", "--link-gbps", "--link-latency-us"}) {
    const CLI::Option* opt = plan->get_option(name);
    if (opt->count() > 0 && opt->as<std::string>().empty()) plan::positiveNumber(name, "");
  }
  return plan::runPlan(options, std::cout);
}

}  // namespace cohort::cli
