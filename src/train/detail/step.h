#pragma once

#include <atomic>

// The step of one rank: what happens between two optimizer steps.
//
//   for each round of the step's micro-batches (training.accumulate_steps;
//   a pipeline's micro_batches at a time):
//     round()        forward, loss, backward of each, in the parallel plan's
//                    schedule (parallel/plan.h), which calls back forward()
//                    and loss() here; on the step's last round the gradient
//                    buckets are exchanged as backward fills them
//   update()         wait for the exchange, optimizer step (or drop it on a
//                    non-finite gradient), zero the gradients
//
// Where features plug in: mixed precision (the forward's autocast and the
// loss scale) and activation recomputation in forward(); how the model is
// spread over the ranks (data parallelism with ZeRO, pipeline stages) in the
// plan; accumulation is the Cycle that the caller passes (setup.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cohort/ckpt/checkpointer.h"
#include "cohort/comm/comm.h"
#include "cohort/config/job.h"
#include "cohort/data/loader.h"
#include "cohort/models/model.h"
#include "cohort/parallel/plan.h"
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

class StepRunner : public parallel::MicroBatchOps {
 public:
  // Times go to `phases` (forward, backward, exposed communication,
  // optimizer, the pipeline's waits).
  StepRunner(const JobConfig& job, parallel::Plan& plan, torch::optim::Optimizer& optimizer,
             const FaultPlan& faults, PhaseTimes& phases, Precision precision);

  // Forward and backward of one round of micro-batches (plan.roundSize()
  // of them, fewer at the end of a step), the first of which is micro-
  // batch `micro` of the epoch, part of `cycle`; `step` optimizer steps are
  // done. The loss is scaled so that, once the exchange has summed the
  // gradients, they are the mean over the step's samples on every data
  // rank. Returns each micro-batch's loss (NaN or Inf when it is: the
  // gradients are then made NaN, so that every rank sees it after the
  // exchange and all decide together in update()).
  std::vector<double> round(const std::vector<data::Batch>& batches, const Cycle& cycle,
                            int64_t micro, int64_t step);

  // parallel::MicroBatchOps, for the plan's schedule: this rank's part of
  // the model on `input` in training.precision (poisoned by the fault plan),
  // and the loss of the round's micro-batch `micro` from the model's output.
  at::Tensor forward(models::Model& model, const at::Tensor& input, size_t micro) override;
  Loss loss(const at::Tensor& output, size_t micro) override;

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
  // The fault plan's poisoned forward: NaN inputs (images, activations) or
  // NaN outputs (tokens).
  at::Tensor poisoned(models::Model& model, const at::Tensor& inputs);
  // Under `cohort agent`, with the model split (tensor slices or pipeline
  // stages): after the step's last collective, before any state changes.
  void agreeToStep();
  const comm::Comm& comm_;  // the job's
  parallel::Plan& plan_;
  models::Model& model_;    // this rank's part
  torch::optim::Optimizer& optimizer_;
  const FaultPlan& faults_;
  PhaseTimes& phases_;
  // The round being run: its batches, cycle and step.
  const std::vector<data::Batch>* batches_ = nullptr;
  Cycle cycle_;
  int64_t step_ = 0;
  bool skipNonfinite_;
  double labelSmoothing_;
  double clipGradNorm_;  // training.clip_grad_norm; 0: off
  bool agreeToStep_;     // agreeToStep() before each optimizer step
  Precision precision_;
  bool cycleLossNonfinite_ = false;       // a loss of this step was NaN or Inf here
  double lastLoss_ = 0;
  std::optional<LossScaler> scaler_;      // training.loss_scale on
  std::vector<at::Tensor> savedBuffers_;  // a step may be dropped: its starting buffers
  int64_t inARow_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace cohort::train::detail
