#include "train/detail/step.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/time.h"
#include "cohort/monitor/activity.h"
#include "cohort/monitor/profiler.h"
#include "cohort/monitor/timeline.h"
#include "cohort/train/optimizer.h"
#include "cohort/train/precision.h"

namespace cohort::train::detail {

std::atomic<bool>& stateMutatingFlag() {
  static std::atomic<bool> flag{false};
  return flag;
}
namespace {

// training.on_nonfinite: skip gives up after this many skipped steps in a row.
constexpr int64_t kMaxNonfiniteInARow = 10;
// Loss scaling gives up after this many overflows in a row: the scale has
// backed off by backoff_factor^50 and the gradients are still not finite.
constexpr int64_t kMaxOverflowsInARow = 50;

}  // namespace

at::Tensor StepRunner::poisoned(models::Model& model, const at::Tensor& inputs) {
  if (inputs.is_floating_point()) {
    return model.compute(inputs * std::numeric_limits<float>::quiet_NaN());
  }
  // Token ids cannot be NaN: the outputs are.
  return model.compute(inputs) * std::numeric_limits<float>::quiet_NaN();
}

StepRunner::StepRunner(const JobConfig& job, parallel::Plan& plan, torch::optim::Optimizer& optimizer,
                       const FaultPlan& faults, PhaseTimes& phases, Precision precision)
    : comm_(plan.mesh().world),
      plan_(plan),
      model_(plan.model()),
      optimizer_(optimizer),
      faults_(faults),
      phases_(phases),
      skipNonfinite_(job.training.onNonfinite == OnNonfinite::skip),
      labelSmoothing_(job.training.labelSmoothing),
      clipGradNorm_(job.training.clipGradNorm),
      agreeToStep_(env::elasticStateDir().has_value() &&
                   (plan.mesh().tensorSplit() || plan.mesh().pipelined())),
      precision_(precision) {
  if (lossScalingOn(job.training.lossScale, precision)) scaler_.emplace(job.training.lossScale);
}

std::vector<double> StepRunner::round(const std::vector<data::Batch>& batches, const Cycle& cycle,
                                      int64_t micro, int64_t step) {
  if (micro == cycle.first) {
    cycleLossNonfinite_ = false;
    if (skipNonfinite_ || scaler_) {
      // A skipped step must not keep what its forward passes did to the
      // BatchNorm statistics either.
      torch::NoGradGuard noGrad;
      savedBuffers_.clear();
      for (const auto& b : model_.buffers()) savedBuffers_.push_back(b.clone());
    }
  }
  // Buffers (BatchNorm statistics) are not sent every step: in training
  // mode no layer reads them, rank 0's are the ones checkpointed, and every
  // rank takes rank 0's before evaluation and the final save. The outputs
  // are those of a broadcast before each step, at no cost.
  batches_ = &batches;
  cycle_ = cycle;
  step_ = step;
  std::vector<at::Tensor> inputs;
  inputs.reserve(batches.size());
  for (const data::Batch& b : batches) inputs.push_back(b.inputs);
  // The step's last round exchanges the gradients.
  const bool exchange = micro + static_cast<int64_t>(batches.size()) == cycle.first + cycle.length;
  parallel::RoundTimes times;
  std::vector<double> losses = plan_.runRound(inputs, exchange, *this, times);
  batches_ = nullptr;
  phases_.backward += times.backward;
  phases_.exposedComm += times.exposedComm;
  phases_.pipelineWait += times.waiting;
  phases_.pipelineTransfer += times.transfer;
  return losses;
}

at::Tensor StepRunner::forward(models::Model& model, const at::Tensor& input, size_t /*micro*/) {
  const auto start = SteadyClock::now();
  monitor::setPhase(monitor::Phase::forward);
  at::Tensor output;
  {
    monitor::TimelineSpan span("forward", "compute");
    monitor::ProfileRange range("forward");
    at::Tensor x = input.to(comm_.device, /*non_blocking=*/true);
    AutocastScope autocast(precision_, comm_.device);
    output = faults_.poisonInputs(step_) ? poisoned(model, x) : model.compute(x);
    faults_.delayForward(step_);  // every stage of a pipeline runs a forward, not every one a loss
  }
  phases_.forward += secondsSince(start);
  return output;
}

parallel::MicroBatchOps::Loss StepRunner::loss(const at::Tensor& output, size_t micro) {
  const auto start = SteadyClock::now();
  const data::Batch& batch = (*batches_)[micro];
  const int64_t n = batch.labels.size(0);
  at::Tensor loss;
  {
    monitor::TimelineSpan span("loss", "compute");
    monitor::ProfileRange range("loss");
    // The loss and its softmax in float32, whatever the forward ran in. A
    // language model's [B, T, vocab] logits are B x T predictions; each
    // window holds T of them, so the mean over tokens is the mean over
    // windows of their means.
    // (The plan's: a tensor group's ranks hold slices of the vocabulary.)
    loss = plan_.outputLoss(output, batch.labels.to(comm_.device), labelSmoothing_);
  }
  const double lossValue = loss.item<double>();
  phases_.forward += secondsSince(start);
  if (!std::isfinite(lossValue)) {
    // Every gradient becomes NaN, so after the exchange every rank sees it
    // and all decide together (a rank stopping alone would leave the others
    // waiting in the exchange).
    loss = loss * std::numeric_limits<double>::quiet_NaN();
    cycleLossNonfinite_ = true;
  }
  lastLoss_ = lossValue;
  // Scaled by 1 / data world too: the exchange sums, so .grad ends as the
  // mean over the data ranks without a division pass over every gradient.
  const double world = plan_.dataWorld();
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  Loss l;
  l.backward = loss * (scale * static_cast<double>(n) / (static_cast<double>(cycle_.samples) * world));
  l.value = lossValue;
  return l;
}

// A split model's state is whole in the nodes' memory only when the ranks
// holding its parts on a node all took a step or all did not. A collective
// over the machines can complete on some ranks and fail on others (a peer
// lost halfway through it); a rank whose collective failed holds the last
// step and exits (trainer.cc). So before changing any state, the ranks of
// each tensor group, then of each pipeline, wait for each other: a rank
// that passes both knows that every rank of its replica got past the
// step's collectives. A node-mate that left fails the wait at once, and
// those that fail here hold the same last step as the one that left.
void StepRunner::agreeToStep() {
  monitor::TimelineSpan span("agreement to step", "comm");
  const parallel::Mesh& mesh = plan_.mesh();
  comm::barrier(mesh.tensor, "agreement of the tensor slices to step");
  comm::barrier(mesh.pipeline, "agreement of the pipeline stages to step");
}

StepRunner::Update StepRunner::update(double lr, int64_t step, int64_t epoch,
                                      ckpt::Checkpointer* checkpointer) {
  const auto t3 = SteadyClock::now();
  monitor::setPhase(monitor::Phase::exchange);
  {
    monitor::TimelineSpan span("gradient exchange (wait)", "comm");
    monitor::ProfileRange range("exchange");
    plan_.finishGradients();
  }
  const auto t4 = SteadyClock::now();
  phases_.exposedComm += secondsBetween(t3, t4);
  monitor::setPhase(monitor::Phase::optimizer);
  Update u;
  {
    monitor::TimelineSpan span("optimizer", "compute");
    monitor::ProfileRange range("optimizer");
    // Every rank reaches the same verdict: from the same gradients, or at
    // ZeRO stage 2 through the exchange or one collective (every rank
    // calls this every step).
    const bool finite = plan_.gradientsFinite();
    const double scale = scaler_ ? scaler_->scale() : 1.0;
    if (finite) {
      inARow_ = 0;
      if (checkpointer) checkpointer->waitCopied();  // the step modifies what is being copied
      if (scale != 1.0) plan_.scaleGradients(1.0 / scale);
      if (clipGradNorm_ > 0) {
        // As torch.nn.utils.clip_grad_norm_: the norm over every gradient
        // (every rank's part at ZeRO stage 2), then one factor for all.
        u.gradNorm = std::sqrt(plan_.gradientSquaredNorm());
        const double factor = clipGradNorm_ / (u.gradNorm + 1e-6);
        if (factor < 1) plan_.scaleGradients(factor);
      }
    }
    faults_.failCollective(step + 1);
    if (agreeToStep_) agreeToStep();
    // From here to the end of the step the state is between two steps: an
    // elastic rank that fails now cannot hold it (trainer.cc).
    StateMutating mutating;
    if (scaler_) {
      scaler_->update(finite);
      u.lossScale = scaler_->scale();
    }
    if (finite) {
      setLearningRate(optimizer_, lr);
      optimizer_.step();
      // ZeRO: this rank stepped its part of the parameters; it takes the others'.
      plan_.afterOptimizerStep();
    } else {
      ++skipped_;
      u.applied = false;
      u.nonfiniteInARow = ++inARow_;
      u.why = cycleLossNonfinite_
                  ? fmt::format("the loss is {} on this rank", lastLoss_)
                  : std::string("a gradient is NaN or Inf (from another rank's loss, or an "
                                "overflow in backward)");
      const bool giveUp = scaler_ ? inARow_ >= kMaxOverflowsInARow
                                  : !skipNonfinite_ || inARow_ >= kMaxNonfiniteInARow;
      if (giveUp) {
        // Every rank is here at the same step: the checkpoints still being
        // written (the last good state) are committed first.
        if (checkpointer) checkpointer->flush();
        throw DivergedError(fmt::format(
            "rank {}: {} at step {} (epoch {}){}: training diverged; the weights were not "
            "updated, the last checkpoint holds the last good state{}",
            comm_.rank, u.why, step + 1, epoch,
            scaler_ ? fmt::format(", {} steps in a row, loss scale down to {}", inARow_, scaler_->scale())
            : skipNonfinite_ ? fmt::format(", {} steps in a row", inARow_)
                             : "",
            scaler_ || skipNonfinite_ ? "" : " (training.on_nonfinite: skip drops such steps instead)"));
      }
      torch::NoGradGuard noGrad;
      auto live = model_.buffers();
      for (size_t k = 0; k < live.size() && k < savedBuffers_.size(); ++k) {
        live[k].copy_(savedBuffers_[k]);
      }
    }
    plan_.zeroGrad();
  }
  phases_.optimizer += secondsSince(t4);
  ++phases_.steps;
  return u;
}

}  // namespace cohort::train::detail
