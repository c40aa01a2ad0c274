#pragma once

#include <atomic>

// The step of one rank: what happens between two optimizer steps.
//
//   for each micro-batch of the step (training.accumulate_steps):
//     microBatch()   forward, loss, backward; on the step's last micro-batch
//                    the gradient buckets are exchanged as backward fills them
//   update()         wait for the exchange, optimizer step (or drop it on a
//                    non-finite gradient), zero the gradients
//
// Where later features plug in: mixed precision (the forward's autocast and
// the loss scale) and activation recomputation in microBatch's forward;
// sharded optimizer state (ZeRO) in update's optimizer step; accumulation is
// the Cycle that the caller passes (setup.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cohort/ckpt/checkpointer.h"
#include "cohort/comm/comm.h"
#include "cohort/config/job.h"
#include "cohort/data/loader.h"
#include "cohort/ddp/ddp.h"
#include "cohort/models/model.h"
#include "cohort/train/loss_scale.h"
#include "cohort/train/trainer.h"
#include "train/detail/faults.h"
#include "train/detail/setup.h"

namespace torch::optim {
class Optimizer;
}

namespace cohort::train::detail {

// Whether the training thread is inside an optimizer step (parameters,
// optimizer state or loss scale partly updated): set for the lifetime of a
// StateMutating. Between steps the state is whole and can be held.
std::atomic<bool>& stateMutatingFlag();
struct StateMutating {
  StateMutating() { stateMutatingFlag().store(true); }
  ~StateMutating() { stateMutatingFlag().store(false); }
  StateMutating(const StateMutating&) = delete;
  StateMutating& operator=(const StateMutating&) = delete;
};

class StepRunner {
 public:
  // Times go to `phases` (forward, backward, exposed communication,
  // optimizer).
  StepRunner(const JobConfig& job, const comm::Comm& comm, models::Model& model,
             ddp::DistributedDataParallel& ddp, torch::optim::Optimizer& optimizer,
             const FaultPlan& faults, PhaseTimes& phases, Precision precision);

  // Forward and backward of micro-batch `micro` of the epoch, part of
  // `cycle`; `step` optimizer steps are done. The loss is scaled so that, once
  // the exchange has summed the gradients, they are the mean over the step's
  // samples on every rank. Returns the loss (NaN or Inf when it is: the
  // gradients are then made NaN, so that every rank sees it after the
  // exchange and all decide together in update()).
  double microBatch(const data::Batch& batch, const Cycle& cycle, int64_t micro, int64_t step);

  struct Update {
    bool applied = true;
    int64_t nonfiniteInARow = 0;
    std::string why;  // when not applied: what was not finite
    double lossScale = 0;  // loss scaling on: the scale after this step
    double gradNorm = -1;  // training.clip_grad_norm on: the norm before clipping
  };
  // After the step's last micro-batch: waits for the exchange and applies
  // the optimizer at learning rate `lr` (waiting first for `checkpointer`'s
  // copy of the state it modifies, if any). A non-finite gradient drops the
  // update (and what the step's forwards did to the buffers) under
  // training.on_nonfinite: skip, up to 10 in a row; otherwise it throws
  // DivergedError after `checkpointer` committed what it holds. With loss
  // scaling (training.loss_scale) a non-finite gradient is an overflow
  // instead: the step is dropped and the scale backs off, and only 50 in a
  // row stop the run. `step` and `epoch` name the step in messages (step
  // counted from 0).
  Update update(double lr, int64_t step, int64_t epoch, ckpt::Checkpointer* checkpointer);

  int64_t skippedSteps() const { return skipped_; }
  // The loss scale now; 0 without loss scaling.
  double lossScale() const { return scaler_ ? scaler_->scale() : 0.0; }
  // The loss scaler; null without loss scaling.
  LossScaler* lossScaler() { return scaler_ ? &*scaler_ : nullptr; }
  // training.precision as buildModel resolved it: fp32, bf16 or fp16.
  Precision precision() const { return precision_; }

 private:
  // The fault plan's poisoned forward: NaN inputs (images) or NaN logits (tokens).
  at::Tensor poisoned(const at::Tensor& inputs);
  const comm::Comm& comm_;
  models::Model& model_;
  ddp::DistributedDataParallel& ddp_;
  torch::optim::Optimizer& optimizer_;
  const FaultPlan& faults_;
  PhaseTimes& phases_;
  bool skipNonfinite_;
  double labelSmoothing_;
  double clipGradNorm_;  // training.clip_grad_norm; 0: off
  Precision precision_;
  bool cycleLossNonfinite_ = false;       // a loss of this step was NaN or Inf here
  double lastLoss_ = 0;
  std::optional<LossScaler> scaler_;      // training.loss_scale on
  std::vector<at::Tensor> savedBuffers_;  // a step may be dropped: its starting buffers
  int64_t inARow_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace cohort::train::detail
