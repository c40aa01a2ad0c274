// cohort-torch: every cohort command, those that need LibTorch among them.
// The front end `cohort` (main.cc) hands it agent, worker, health,
// generate, export, serve, score and ckpt inspect|consolidate with the same
// arguments; `cohort run` starts its ranks with it. Users run `cohort`.

#include <CLI/CLI.hpp>

#include <cstring>

#include "cohort/core/signals.h"
#include "cohort/launch/fork_server.h"

#include "base.h"
#include "common.h"
#include "engine.h"

namespace {

int engineMain(int argc, char** argv) {
  // Before anything else: a stop sent while this process (or cohort-torch,
  // which it becomes) starts waits until it is taken (core/signals.h).
  cohort::holdStopSignals(argc > 1 ? argv[1] : nullptr);
  namespace cli = cohort::cli;
  CLI::App app{"cohort: data-parallel deep-learning training", "cohort"};
  cli::describeApp(app);
  cli::BaseCommands base;
  base.add(app);
  cli::TorchCommands torch;
  torch.add(app, base);
  if (auto code = cli::parse(app, argc, argv)) return *code;
  base.setUmask();
  try {
    if (auto code = base.dispatch(app, argc)) return *code;
    return torch.dispatch().value_or(0);
  } catch (...) {
    return cli::reportEngineException();
  }
}

}  // namespace

// `cohort-torch --fork-server`: the process a launcher forks its ranks from
// (launch/fork_server.h); each fork runs engineMain as a started program.
int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], cohort::launch::kForkServerArg) == 0) {
    return cohort::launch::serveForks(argc, argv, engineMain);
  }
  return engineMain(argc, argv);
}
