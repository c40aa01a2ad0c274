#pragma once

// Pipeline parallelism (docs/parallelism.md): the model split into stages of
// consecutive blocks, stage s held by the ranks at pipeline coordinate s
// (parallel/mesh.h), each building and holding only its own part
// (models::ModelPart). A round of M micro-batches flows through the stages:
// activations forward from stage s to s+1, their gradients back from s+1 to
// s (Gloo send/recv on the replica's pipeline group). Data parallelism (any
// ZeRO stage) runs within each stage's replicas as it does for a whole
// model (the base Plan's engine over mesh.data).
//
// Schedules, per stage s of P with M micro-batches (F: forward, B: backward):
//   gpipe  F0 F1 ... F(M-1), then B0 ... B(M-1): every micro-batch's
//          activations are held at once.
//   1f1b   min(P-1-s, M) forwards to fill the pipeline, then one forward and
//          one backward in turn, then the remaining backwards: at most P-s
//          micro-batches' activations are held, whatever M is.
// Both leave each stage idle for (P-1)/(M+P-1) of a round when the stages
// take equal time (the bubble): PipelineStats measures it.
//
// Tensors held by both the first and the last stage (GPT's token embedding,
// which is also its output head) are kept out of the engine's buckets; their
// gradients are summed over every first- and last-stage rank of every
// replica after the exchange, and both stages step them whole.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/parallel/plan.h"

namespace cohort::parallel {

namespace detail {
class StageLink;
}
class TensorParallelModel;

enum class ScheduleKind { oneFOneB, gpipe };

// One action of a stage's schedule: the forward or backward of a micro-batch.
struct ScheduleStep {
  bool forward = true;
  int micro = 0;
};
// The order in which stage `stage` of `stages` runs a round of `micro`
// micro-batches.
std::vector<ScheduleStep> scheduleOf(ScheduleKind kind, int stage, int stages, int micro);
// The fraction of a round a stage is idle when every stage takes the same
// time per micro-batch: (P-1)/(M+P-1).
double bubbleFraction(int stages, int micro);

// The blocks of each stage for blocks of cost `costs` (in order) over
// `stages` stages: consecutive, at least one each, the most expensive stage
// as cheap as can be (ties: the earlier stages take fewer blocks).
std::vector<int64_t> balanceStages(const std::vector<double>& costs, int stages);

struct PipelineOptions {
  int microBatches = 4;
  ScheduleKind schedule = ScheduleKind::oneFOneB;
  // Tensors (by name) held by both the first and the last stage.
  std::vector<std::string> tied;
  // Activations and gradients between stages on one machine through shared
  // memory, in rings of slots sized for `maxBatch` samples (a larger
  // micro-batch goes over Gloo); false, or maxBatch 0: Gloo only.
  bool sharedMemory = true;
  int64_t maxBatch = 0;
};

// What a stage measured over its rounds.
struct PipelineStats {
  int stage = 0;
  int stages = 1;
  int microBatches = 0;
  int64_t rounds = 0;
  double roundSeconds = 0;  // from a round's first action until every stage has ended it
  double recvSeconds = 0;   // blocked receiving activations or gradients (waiting, and their transfer)
  double endSeconds = 0;    // waiting at the round's end for the other stages to end it
  double sendSeconds = 0;   // handing activations and gradients on, and waiting for the sends
  int64_t bytesSent = 0;
  int64_t bytesReceived = 0;
  int heldPeak = 0;  // the most micro-batches whose activations were held at once
  // The share of its rounds a stage did not compute: blocked on a
  // neighbour, at the start (filling) or in the middle, or waiting at the end
  // (draining). The bubble, (P-1)/(M+P-1), when stages take equal time.
  double idleFraction() const {
    return roundSeconds > 0 ? (recvSeconds + endSeconds) / roundSeconds : 0;
  }
};

class Pipeline : public Plan {
 public:
  // `stage` is this rank's part of the model (mesh.stage of mesh.stages).
  Pipeline(Mesh mesh, std::shared_ptr<models::Model> stage, DdpOptions ddp, PipelineOptions options);
  ~Pipeline() override;

  int roundSize() const override { return options_.microBatches; }
  void start() override;
  std::vector<at::Tensor> optimizerParameters() const override;
  std::vector<std::string> optimizerNames() const override;
  // With ZeRO, the tied tensors after the engine's parts, each whole.
  std::vector<std::vector<ckpt::PartSlice>> optimizerSlices() const override;
  std::vector<double> runRound(const std::vector<at::Tensor>& inputs, bool exchange,
                               MicroBatchOps& ops, RoundTimes& times) override;
  void finishGradients() override;
  bool gradientsFinite() override;
  double gradientSquaredNorm() override;
  void scaleGradients(double factor) override;
  void zeroGrad() override;
  at::Tensor evalForward(const at::Tensor& input, MicroBatchOps& ops) override;
  void visitCollected(const Publish& publish, const Visit& visit) override;
  // Stages split over a tensor group (mesh.tensors > 1: `stage` is this
  // rank's slices of its part, a TensorParallelModel): the loss and
  // evaluation from the vocabulary's slices, the split's layout.
  at::Tensor outputLoss(const at::Tensor& output, const at::Tensor& labels, double labelSmoothing) override;
  OutputScore scoreOutput(const at::Tensor& output, const at::Tensor& labels) override;
  nlohmann::json tensorLayout() const override;

  const PipelineOptions& options() const { return options_; }
  PipelineStats stats() const;
  // Elements of the tied tensors this stage holds outside the engine.
  int64_t tiedElements() const;

 private:
  PipelineOptions options_;
  std::unique_ptr<detail::StageLink> links_;
  int64_t collects_ = 0;  // visitCollected() calls so far: each has its own store keys
  // The tied tensors this stage holds (first and last stage), and the group
  // of every first- and last-stage rank their gradients are summed over.
  std::vector<std::pair<std::string, at::Tensor>> tied_;
  comm::Comm tiedGroup_;
  std::shared_ptr<TensorParallelModel> split_;  // a tensor-parallel stage; null otherwise
  PipelineStats stats_;
};

// The plan of a mesh with several stages.
std::unique_ptr<Plan> pipeline(Mesh mesh, std::shared_ptr<models::Model> stage, DdpOptions ddp,
                               PipelineOptions options);

}  // namespace cohort::parallel
