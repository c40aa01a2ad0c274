#pragma once

// The commands without LibTorch, which both programs run (common.h): run,
// validate, ckpt list|verify|decrypt, data, logs, report, help, submit, runs,
// status, cancel, plan.

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "cluster.h"
#include "cohort/data/pack.h"
#include "cohort/data/tokens.h"
#include "cohort/launch/debug.h"
#include "cohort/monitor/logs.h"
#include "cohort/monitor/report.h"
#include "cohort/security/sealed.h"
#include "plan.h"

namespace cohort::cli {

// Every option of these commands, as CLI11 fills them in.
struct BaseCommands {
  BaseCommands() = default;
  BaseCommands(const BaseCommands&) = delete;  // `so` refers to this object's packOptions
  BaseCommands& operator=(const BaseCommands&) = delete;

  // run, validate
  CLI::App *run = nullptr, *validate = nullptr;
  std::string jobPath, runDir;
  std::vector<std::string> overrides;
  int procs = 0;
  std::string resume;
  bool newRun = false;
  std::string planFile;
  bool timeline = false;
  std::string profile;  // --profile STEPS; given when run->count("--profile")
  int metricsPort = 0;
  launch::DebugOptions debug;  // run: --debug, --debug-on-failure
  // ckpt: the parent, and its commands without LibTorch
  CLI::App *ckpt = nullptr, *ckptList = nullptr, *ckptVerify = nullptr, *ckptDecrypt = nullptr;
  std::string ckptPath;
  std::string decryptOut;
  security::KeySources keySources;
  // data
  CLI::App *data = nullptr, *dataPack = nullptr, *dataInspect = nullptr, *dataVerify = nullptr,
           *dataTokenize = nullptr;
  data::TokenizeOptions tokenizeOptions;
  std::string dataSrc, dataDst, dataPath;
  data::PackOptions packOptions;
  storage::StorageOptions& so = packOptions.storage;
  double shardMb = 256;
  bool noProgress = false, decode = false;
  int64_t inspectRecords = 0;
  // logs, report, help
  CLI::App *logs = nullptr, *report = nullptr, *help = nullptr;
  monitor::LogsOptions logsOptions;
  monitor::ReportOptions reportOptions;
  std::string helpTopic;
  // submit, runs, status, cancel; plan
  ClusterCommands cluster;
  PlanCommand planCommand;

  // Registers every command.
  void add(CLI::App& app);
  // --key-file and --previous-key-file of a data command.
  void addKeyFile(CLI::App* sub, const char* what);
  // The same for a `cohort ckpt` command.
  void addCkptKeyFile(CLI::App* sub);
  // Sets the process's umask for the command parsed: run directories,
  // checkpoints and logs are this user's only (0700/0600); a dataset written
  // by `data pack` or `tokenize` keeps the user's umask, as datasets are made
  // to be shared.
  void setUmask() const;
  // After parsing: the exit code of the command parsed, or nullopt when it
  // is none of these. Installs the keyring of --key-file first.
  std::optional<int> dispatch(CLI::App& app, int argc);

 private:
  void addTraining(CLI::App& app);
  void addCkpt(CLI::App& app);
  void addData(CLI::App& app);
  void addLogsHelp(CLI::App& app);
  int showHelp(CLI::App& app, int argc) const;
};

}  // namespace cohort::cli
