#pragma once

// One rank's training as four parts over one state object
// (docs/architecture.md, "The path of one step"):
//
//   setUp(s)       datasets, the resumed checkpoint's checks, this rank's
//                  part of the model and the parallel plan over it, loaders,
//                  the plan of steps, optimizer, reporter, step runner and
//                  checkpoint policy (state.cc)
//   resume(s)      what the checkpoint holds beyond the weights: this rank's
//                  random state, the optimizer state, the loss scale, and
//                  where in the data training goes on (state.cc)
//   setUpProfiler(s) the operator profiler of output.profile (profiling.cc)
//   runEpochs(s)   the epochs of steps and their evaluations (trainer.cc)
//   finish(s)      the summary's figures and model/final.pt (trainer.cc)
//
// Each part reads and fills TrainState; nothing else passes between them.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/ckpt/manifest.h"
#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/monitor/profiler.h"
#include "cohort/parallel/mesh.h"
#include "cohort/parallel/plan.h"
#include "cohort/train/lr_schedule.h"
#include "cohort/train/trainer.h"
#include "train/detail/memory_fit.h"
#include "train/detail/checkpoint_policy.h"
#include "train/detail/faults.h"
#include "train/detail/reporting.h"
#include "train/detail/setup.h"
#include "train/detail/step.h"

namespace torch::optim {
class Optimizer;
}

namespace cohort::train::detail {

struct TrainState {
  TrainState(const JobConfig& job, const parallel::Mesh& mesh, const RunDir& runDir,
             const TrainOptions& options);
  ~TrainState();
  TrainState(const TrainState&) = delete;
  TrainState& operator=(const TrainState&) = delete;

  const JobConfig& job;
  const parallel::Mesh& mesh;
  const comm::Comm& comm;  // the job's: mesh.world
  const RunDir& runDir;
  const TrainOptions options;
  const FaultPlan faults;

  // setUp
  MemoryShare memory;  // this rank's memory limit and the ranks under it
  Datasets datasets;
  std::optional<ckpt::Manifest> resumed;  // the checkpoint options.resumeFrom names
  std::vector<int64_t> split;             // a pipeline's blocks per stage (empty: none)
  bool restaged = false;                  // resumed from a checkpoint of other stages (resolveSplit)
  ModelSetup model;                       // this rank's part of the model
  std::unique_ptr<parallel::Plan> plan;
  Loaders loaders;
  StepPlan steps;
  std::unique_ptr<LrSchedule> schedule;
  std::vector<std::string> optimizerNames;
  nlohmann::json zero;  // the ZeRO layout manifests record (null without ZeRO)
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  TrainSummary summary;
  std::unique_ptr<Reporter> reporter;
  std::unique_ptr<StepRunner> runner;
  std::unique_ptr<CheckpointPolicy> checkpoints;
  std::unique_ptr<SampleLog> samples;
  std::unique_ptr<monitor::Profiler> profiler;  // output.profile; null: off

  // resume: where the first epoch begins.
  ResumeAt at;

  // The loop.
  int64_t step = 0;
  double trainSeconds = 0;  // in the epochs' steps
  double waitSeconds = 0;   // of which waiting for batches
};

// The parts in train()'s order; each throws what its steps throw (ConfigError
// and DataError for what the job or its inputs cannot do, CommError when a
// peer fails).
void setUp(TrainState& s);
void resume(TrainState& s);
// After resume: the operator profiler of output.profile, when it has steps
// left to record (profiling.cc). Throws ConfigError naming output.profile
// and --profile when its steps begin past the run's last step; warns and
// cuts a range that ends past it.
void setUpProfiler(TrainState& s);

}  // namespace cohort::train::detail
