#pragma once

// The commands that need LibTorch (commands.h), which only cohort-torch
// runs: agent, worker, health, generate, export, serve, score, ckpt
// inspect|consolidate.

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "base.h"
#include "cohort/elastic/agent.h"
#include "cohort/health/health.h"
#include "cohort/serve/export.h"
#include "cohort/serve/score.h"
#include "cohort/serve/server.h"
#include "cohort/infer/generate.h"

namespace cohort::cli {

struct TorchCommands {
  // agent, worker
  CLI::App *agent = nullptr, *worker = nullptr;
  std::string jobPath, runDir, resume;
  std::vector<std::string> overrides;
  int procs = 0;
  elastic::AgentOptions agentOptions;
  std::string nnodes;
  std::string agentOnSigterm = "leave";
  // health
  CLI::App* health = nullptr;
  health::HealthCommandOptions healthOptions;
  // generate
  CLI::App* generate = nullptr;
  infer::GenerateOptions generateOptions;
  bool generateNoCache = false, generateTiming = false, generateTensor = false;
  int generateProcs = 1;
  // ckpt inspect, consolidate (under the base commands' `ckpt`)
  CLI::App *ckptInspect = nullptr, *ckptConsolidate = nullptr;
  std::string ckptPath;
  bool ckptTensors = false;
  std::string consolidateOut, consolidateOutOption, consolidateOptimizer, consolidateFormat;
  // export, serve, score
  CLI::App *exportCmd = nullptr, *serveCmd = nullptr, *scoreCmd = nullptr;
  serve::ExportOptions exportOptions;
  std::string exportBatch = "dynamic";
  serve::ServeOptions serveOptions;
  serve::ScoreOptions scoreOptions;

  // Registers these commands beside `base`'s (the ckpt ones under base.ckpt).
  void add(CLI::App& app, BaseCommands& base);
  // After parsing and base.dispatch(): the exit code of the command parsed,
  // or nullopt when it is none of these. `cohort worker` does not return.
  std::optional<int> dispatch();
};

// reportCurrentException() with LibTorch's errors reported without their
// C++ backtrace.
int reportEngineException();

}  // namespace cohort::cli
