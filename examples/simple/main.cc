// The smallest use of libcohort from C++: one process trains a small CNN on
// synthetic data with cohort's data pipeline, DDP engine and trainer, and
// writes a run directory. Run several copies under torchrun-style variables
// (or use `cohort run`) and the same code trains data-parallel.
//
//   ./build/examples/cohort_simple [RUN_DIR]

#include <cstdio>

#include "cohort/comm/comm.h"
#include "cohort/config/load.h"
#include "cohort/core/log.h"
#include "cohort/core/run_dir.h"
#include "cohort/train/trainer.h"

int main(int argc, char** argv) {
  // A job is plain structs; here it comes from YAML text, with every default
  // filled in and checked like a job file.
  cohort::JobConfig job = cohort::loadJobFromString(R"(
name: simple
model: {arch: simple_cnn, num_classes: 4, width: 8, hidden: 32}
data:
  train: {kind: synthetic, size: 512, shape: [1, 16, 16]}
  eval: {kind: synthetic, size: 128, shape: [1, 16, 16], seed: 1}
training:
  epochs: 2
  batch_size: 32
  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
output: {progress: plain}
)", "simple example");

  cohort::log::Options logOptions;
  logOptions.tag = "simple";
  cohort::log::init(logOptions);
  // A process group of one; world size and rank come from the launcher in
  // a real job (see cohort::train::runWorker).
  cohort::comm::CommOptions co;
  co.masterPort = 0;  // a free port
  co.hostStore = true;
  cohort::comm::Comm comm = cohort::comm::connect(co);

  cohort::RunDir dir = cohort::openRunDir(argc > 1 ? argv[1] : "runs/simple");
  cohort::train::TrainSummary s = cohort::train::train(job, comm, dir);
  std::printf("top-1 %.3f after %lld steps; weights in %s\n", s.lastEval.top1,
              static_cast<long long>(s.steps), dir.finalModel().c_str());
  return 0;
}
