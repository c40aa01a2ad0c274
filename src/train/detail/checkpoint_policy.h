#pragma once

// When a rank checkpoints and what each checkpoint holds. Parameters,
// buffers and optimizer state are the same on every rank after a step, so
// rank 0 writes them (model.bin, optimizer.bin) -- with ZeRO every rank
// writes its parts of the optimizer state, and at stage 3 of the
// parameters; every rank writes its own random state (rank-<r>.bin,
// ckpt/rank_state.h). The Checkpointer copies
// and writes in the background (docs/architecture.md); this class decides
// when (checkpoint.every_steps, every_epochs, a stop request) and gathers
// the live tensors.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/ckpt/checkpointer.h"
#include "cohort/comm/comm.h"
#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/parallel/plan.h"
#include "cohort/models/model.h"
#include "cohort/train/loss_scale.h"
#include "cohort/train/optimizer.h"
#include "train/detail/memory_fit.h"
#include "train/detail/reporting.h"
#include "train/detail/setup.h"
#include "train/detail/stop_protocol.h"

namespace cohort::train::detail {

class CheckpointPolicy {
 public:
  // With checkpoint.enabled: a Checkpointer for this rank writing to
  // ckpt::checkpointDir (and, on rank 0, the remote tier), its host buffers
  // reserved, and the lists of live tensors built once. Without it, nothing
  // is taken and stop requests end the rank at once (StopProtocol).
  // The files are those `plan` gives this rank (parallel::CheckpointRole),
  // of the model part it holds.
  // A snapshot copy that would leave too little of the rank's memory share
  // is not taken: checkpoints are then written in place (as with
  // checkpoint.max_in_flight: 0).
  CheckpointPolicy(const JobConfig& job, const parallel::Plan& plan, const RunDir& runDir,
                   torch::optim::Optimizer& optimizer, const std::vector<std::string>& paramNames,
                   const StepPlan& steps, const MemoryShare& mem);

  // The epoch about to run: taken up at position `from` of its order (0: at
  // its start) and planned as `epochPlan` (StepPlan::takenUpWith). Each
  // manifest's position counts from there.
  void startEpoch(int64_t from, const StepPlan& epochPlan) {
    epochFrom_ = from;
    epochPlan_ = epochPlan;
  }

  // Null when checkpoints are off.
  ckpt::Checkpointer* checkpointer() const { return checkpointer_.get(); }

  // Each manifest records this scaler's state (extra.loss_scale) from now on.
  void recordLossScale(const LossScaler* scaler) { scaler_ = scaler; }
  // model.lora: each manifest records the frozen weights' digest
  // (extra.lora_base_digest; models::frozenDigest).
  void recordLoraBase(std::string digest) { loraBaseDigest_ = std::move(digest); }
  // distribution.zero > 0: each manifest records how the optimizer state is
  // cut into parts (extra.zero: Plan::zeroLayout()).
  void recordZero(nlohmann::json layout) { zero_ = std::move(layout); }
  // distribution.zero 3: the parameters are held in parts
  // (Plan::parametersInParts), and each rank writes its parts (ckpt::modelPartFile) as it does its optimizer state;
  // model.bin holds the rest of the model, and extra.zero says how to put
  // it together (ckpt::CheckpointTensors). Call after recordZero.
  void writeParametersInParts(const parallel::Plan& plan);
  // The ZeRO layout recorded (with writeParametersInParts's additions);
  // null without ZeRO.
  const nlohmann::json& zeroLayout() const { return zero_; }
  // A pipeline: each manifest records its layout (extra.pipeline, with
  // every stage's ZeRO layout in stage_zero) instead of extra.zero.
  void recordPipeline(nlohmann::json layout) { pipeline_ = std::move(layout); }
  // A tensor split (Plan::tensorLayout): each manifest's extra.tensor, from
  // which a reader puts the split tensors together (ckpt::CheckpointTensors).
  void recordTensor(nlohmann::json layout) { tensor_ = std::move(layout); }

  // After optimizer step `step` (counted from 1), at micro-batch `micro` of
  // `epoch`, trained at learning rate `lr`: reports background failures,
  // takes a checkpoint when one is due, and on an agreed stop request takes
  // the last one, waits until it is durable and returns true. Throws IoError
  // when that last checkpoint could not be written.
  bool afterStep(int64_t step, int64_t epoch, int64_t micro, double lr, Reporter& reporter);

  // Waits for every checkpoint in flight; logs and returns the counts.
  ckpt::CheckpointStats finish();

  // Under `cohort agent`: afterStep stopped for a re-form, the state held in
  // the node's memory (ckpt/held_state.h) instead of a checkpoint.
  bool reformed() const { return reformed_; }

  // Under `cohort agent`: optimizer step `step` is complete (as afterStep's
  // arguments); the state is whole there until the next step changes it.
  void markBoundary(int64_t step, int64_t epoch, int64_t micro, double lr);
  // After a failure elsewhere (an abandoned collective): holds the state of
  // the last boundary marked, if any step was completed since `since`.
  // Returns the step held, or -1.
  int64_t holdLastBoundary(int64_t since);

 private:
  ckpt::Manifest manifestAt(int64_t step, int64_t epoch, int64_t micro, double lr) const;
  // This rank's files of a snapshot; `writesShared`: also the model file
  // and, without ZeRO, the optimizer's.
  std::vector<ckpt::SnapshotFile> filesOf(bool writesShared);
  bool take(int64_t step, int64_t epoch, int64_t micro, double lr, Reporter& reporter);
  // The state of this step into elastic.state_dir, now.
  void hold(int64_t step, int64_t epoch, int64_t micro, double lr);

  const JobConfig& job_;
  const int rank_;
  const int world_;
  const int localRank_;
  // Writes the shared files of its stage and slice into the node's held
  // state: the lowest of this node's ranks in that role.
  bool holdsShared_ = false;
  const parallel::CheckpointRole role_;
  const int dataWorld_;  // the ranks the epoch's samples are split over
  const std::string heldDir_;  // COHORT_ELASTIC_STATE: under `cohort agent`
  bool reformed_ = false;
  struct Boundary {
    int64_t step = -1, epoch = 0, micro = 0;
    double lr = 0;
    int64_t epochFrom = 0;
    StepPlan plan;
  } boundary_;
  nlohmann::json manifestExtra_;
  StepPlan epochPlan_;
  int64_t epochFrom_ = 0;
  StopProtocol stop_;
  std::unique_ptr<ckpt::Checkpointer> checkpointer_;
  std::string arch_;
  std::string loraBaseDigest_;
  const LossScaler* scaler_ = nullptr;
  const bool sharded_;  // distribution.zero > 0: every rank writes its optimizer state
  nlohmann::json zero_;
  nlohmann::json pipeline_;
  nlohmann::json tensor_;
  std::string jobHash_;
  std::vector<ckpt::SnapshotItem> modelItems_;
  // partList_: stage 3, this rank's parts of the parameters.
  std::shared_ptr<const std::vector<ckpt::SnapshotItem>> modelList_, optimizerList_, partList_;
  OptimizerStateCache optimizerCache_;
  uint64_t optimizerGeneration_ = 0;
};

}  // namespace cohort::train::detail
