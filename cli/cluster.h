#pragma once

// The commands that hand a job to a cluster's scheduler and keep track of
// runs: submit, runs, status, cancel (cohort/cluster/).

#include <CLI/CLI.hpp>

#include <optional>

#include "cohort/cluster/submit.h"
#include "cohort/monitor/logs.h"

namespace cohort::cli {

struct ClusterCommands {
  CLI::App *submit = nullptr, *runs = nullptr, *status = nullptr, *cancel = nullptr, *freePort = nullptr;
  cluster::SubmitOptions submitOptions;
  bool slurm = false, k8s = false, noSlurm = false;
  std::string dir;

  void add(CLI::App& app);
  // The exit code of the command parsed, or nullopt when it is none of these.
  std::optional<int> dispatch();
  // `cohort logs`: a submitted run without logs yet says where its Slurm job is.
  static int logs(const monitor::LogsOptions& options);
};

}  // namespace cohort::cli
