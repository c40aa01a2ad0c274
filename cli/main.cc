// The cohort command line: parses arguments and calls libcohort. This is the
// front end (common.h): it runs the commands without LibTorch itself and
// hands the others to cohort-torch (engine_main.cc) beside it.
//
//   cohort run JOB.yaml [--set key.path=value ...] [--run-dir DIR] [--procs N]
//   cohort worker JOB.yaml [--set ...] [--run-dir DIR]
//   cohort validate JOB.yaml [--set ...]
//   cohort ckpt list|verify|inspect PATH | decrypt FILE OUT --key-file K
//   cohort ckpt consolidate PATH OUT.pt|OUT.safetensors [--optimizer OPT.pt] [--format pt|safetensors]
//   cohort data pack SRC DST | tokenize SRC DST [--tokenizer sentencepiece --vocab-size N] | inspect PATH | verify PATH
//   cohort generate RUN_DIR --prompt TEXT --tokens N [--top-p P] [--stop S] [--no-kv-cache]
//   cohort export MODEL --format onnx|torchscript|safetensors|huggingface [--out PATH] [--batch dynamic|N]
//   cohort serve MODEL [--port P] [--host H] [--max-batch B] [--max-delay-ms D] [--threads T]
//                [--max-step-tokens N] [--kv-block-tokens N] [--truncate-prompt none|left]
//   cohort score MODEL --data DATA --out predictions.jsonl [--procs N]
//   cohort health [JOB] [--procs N] [--json] [--set ...]
//   cohort logs RUN_DIR [--rank r] [--follow]
//   cohort report RUN_DIR [-o PAGE.html] [--plan PLAN.json]
//   cohort submit JOB.yaml --slurm|--k8s [--sweep key=v1,v2 ...] [--nodes N] [--time T] ...
//   cohort runs DIR | status RUN_DIR | cancel RUN_DIR
//   cohort help [COMMAND] | cohort --version
//
// Exit codes: 0 success; 2 bad input (job file, data, arguments); 1 a failure
// during training; 75 stopped on SIGTERM after a checkpoint (rerun resumes);
// 128+N when stopped by signal N. A rank (`cohort worker`) also exits 3 when
// training diverged, 4 when it gave up on a stalled collective and 5 when a
// preflight health check failed; `cohort run` reports them and exits 1.

#include <CLI/CLI.hpp>

#include "cohort/core/signals.h"

#include "base.h"
#include "commands.h"
#include "common.h"

int main(int argc, char** argv) {
  // Before anything else: a stop sent while this process (or cohort-torch,
  // which it becomes) starts waits until it is taken (core/signals.h).
  cohort::holdStopSignals(argc > 1 ? argv[1] : nullptr);
  namespace cli = cohort::cli;
  if (cli::needsEngine(argc, argv)) return cli::execEngine(argc, argv);
  CLI::App app{"cohort: data-parallel deep-learning training", "cohort"};
  cli::describeApp(app);
  cli::BaseCommands base;
  base.add(app);
  cli::addEngineStubs(app, base.ckpt);
  if (auto code = cli::parse(app, argc, argv)) return *code;
  base.setUmask();
  try {
    return base.dispatch(app, argc).value_or(0);
  } catch (...) {
    return cli::reportCurrentException();
  }
}
