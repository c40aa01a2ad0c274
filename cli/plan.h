#pragma once

// `cohort plan`: memory, speed and cost before a run, and --tune
// (cohort/plan/plan.h).

#include <CLI/CLI.hpp>

#include <optional>

#include "cohort/plan/plan.h"

namespace cohort::cli {

struct PlanCommand {
  CLI::App* plan = nullptr;
  plan::PlanOptions options;

  void add(CLI::App& app);
  // The exit code, or nullopt when `cohort plan` was not the command.
  std::optional<int> dispatch();
};

}  // namespace cohort::cli
