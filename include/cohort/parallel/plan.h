#pragma once

// How the model of a job is spread over its ranks: the one interface the
// training loop talks to (docs/parallelism.md). A plan answers
//
//   what this rank holds      model(): the whole model, or its pipeline stage
//   what it optimizes         optimizerParameters(), optimizerNames()
//   how the output is read    outputLoss(), scoreOutput(): whole classes, or
//                               a tensor group's slices of them
//   how a step's micro-       runRound(): a round of micro-batches forward and
//     batches run               backward in the plan's schedule (one micro-
//                               batch, as accumulation always ran; 1F1B or
//                               GPipe across the stages of a pipeline)
//   how gradients are         finishGradients(), gradientsFinite(),
//     finished                  gradientSquaredNorm(), scaleGradients(),
//                               afterOptimizerStep(), zeroGrad()
//   which files a checkpoint  checkpointRole(): the stage's file names, and
//     writes                    whether this rank writes the shared ones;
//                               zeroLayout(), optimizerSlices(),
//                               parametersInParts(): how the optimizer state
//                               and (ZeRO stage 3) the parameters are cut
//   what the whole model is   writeByUnit(), frozenDigestByUnit(): written
//     when held in parts        or hashed one unit at a time
//   what the exchange did     stats()
//   the sampler's split       dataRank(), dataWorld(): the replica, not the
//                               job rank
//
// Data parallelism over the whole model (with ZeRO 0-3) is the plan of a
// mesh with one stage; a pipeline (parallel/pipeline.h) splits the model
// into stages and runs data parallelism within each stage's replicas.
//
// The training loop owns what a micro-batch means (its inputs, loss,
// precision, faults): the schedule calls back into MicroBatchOps for the
// forward of this rank's part and, where the model's output is, the loss.

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/ckpt/zero_state.h"
#include "cohort/config/choices.h"
#include "cohort/models/model.h"
#include "cohort/parallel/mesh.h"
#include "cohort/parallel/options.h"

namespace cohort::security {
struct Key;
}

namespace cohort::parallel {

class DistributedDataParallel;

class MicroBatchOps {
 public:
  virtual ~MicroBatchOps() = default;
  // This rank's part of the model applied to `input` (the batch's inputs on
  // the first stage, the previous stage's activations elsewhere) for
  // micro-batch `micro` of the round.
  virtual at::Tensor forward(models::Model& model, const at::Tensor& input, size_t micro) = 0;
  struct Loss {
    at::Tensor backward;  // what backward starts from (scaled for the exchange)
    double value = 0;     // the loss itself
  };
  // On the rank that holds the model's output: micro-batch `micro`'s loss.
  virtual Loss loss(const at::Tensor& output, size_t micro) = 0;
};

// Where a round's time went on this rank, in seconds (added to).
struct RoundTimes {
  double backward = 0;     // backward's compute
  double exposedComm = 0;  // shared-memory gradient sums, which run inside backward
  double waiting = 0;      // pipeline: blocked on a neighbour's activations or gradients
  double transfer = 0;     // pipeline: sending and receiving them
};

// What Plan::writeByUnit writes of the published state dict
// (models::publishedStateDict names), and the value written for one (given
// the model's tensor, gathered).
struct UnitWrite {
  std::function<bool(const std::string&)> keep;
  std::function<at::Tensor(const std::string&, const at::Tensor&)> value;
  // Whether each unit's trainable bucket is gathered with it: false when
  // neither `keep` nor `value` reads a trainable parameter (model/base.pt).
  bool trainable = true;
};

// The files of a checkpoint this rank writes (ckpt/rank_state.h names them).
struct CheckpointRole {
  int stage = 0;
  int stages = 1;             // > 1: every file name carries the stage (ckpt::stageFile)
  int slice = 0;              // the tensor rank, whose slices the files hold
  int slices = 1;             // > 1: every file name carries the slice (ckpt::sliceFile)
  int dataRank = 0;           // the index of this rank's ZeRO part files
  bool writesShared = false;  // the stage's (slice's) model file (and the unsharded optimizer's)
  // The name of this rank's stage's (and slice's) file `name`.
  std::string file(const std::string& name) const;
};

// What evaluation counts of a batch's output on this rank (added up over
// the job's ranks): the summed loss, the top-1 and top-5 hits and the
// predictions, each counted once per data replica.
struct OutputScore {
  double lossSum = 0;
  double top1 = 0;
  double top5 = 0;
  double count = 0;
};

class Plan {
 public:
  // Data parallelism over `model`, whole, on mesh.data (with mesh.stages 1)
  // or over one stage's part (the pipeline's base). Buckets and hooks the
  // model's trainable parameters (DistributedDataParallel).
  Plan(Mesh mesh, std::shared_ptr<models::Model> model, DdpOptions options);
  virtual ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  const Mesh& mesh() const { return mesh_; }
  int dataRank() const { return mesh_.replica; }
  int dataWorld() const { return mesh_.replicas; }
  // Micro-batches that run through the schedule together: 1 here, the
  // pipeline's micro_batches there.
  virtual int roundSize() const { return 1; }

  models::Model& model() { return *model_; }
  const models::Model& model() const { return *model_; }
  // What the exchange among the data group did and what this rank holds
  // (buckets, path, ZeRO's elements): for logs and summary.json.
  DdpStats stats() const;

  // Every rank of the data group takes its rank 0's parameters and buffers,
  // and the model runs its units through the engine (ZeRO stage 3).
  // Collective. Call once, before training.
  virtual void start();

  // What the optimizer steps (the trainable parameters, or with ZeRO this
  // rank's part of each bucket), and the name of each in checkpoints.
  virtual std::vector<at::Tensor> optimizerParameters() const;
  virtual std::vector<std::string> optimizerNames() const;

  // One round: the micro-batches' `inputs` (read on the first stage) forward
  // and backward in the schedule, with `ops`. `exchange`: the step's last
  // round, whose backward exchanges the gradients. Returns each micro-
  // batch's loss, the same on every rank of the replica.
  virtual std::vector<double> runRound(const std::vector<at::Tensor>& inputs, bool exchange,
                                       MicroBatchOps& ops, RoundTimes& times);

  // After the step's last round, before the optimizer step: the exchange
  // completed (DistributedDataParallel::finishGradients).
  virtual void finishGradients();
  // Whether every gradient is finite: the same answer on every rank of the
  // job. Collective.
  virtual bool gradientsFinite();
  // The squared norm of the whole model's gradients, the same on every
  // rank. Collective.
  virtual double gradientSquaredNorm();
  virtual void scaleGradients(double factor);
  // After the optimizer stepped: ZeRO's parts gathered.
  virtual void afterOptimizerStep();
  virtual void zeroGrad();
  // Buffers (BatchNorm statistics) follow the data group's rank 0.
  void syncBuffers();

  // Evaluation's forward of `input` through the whole model: the output on
  // the rank that holds it (holdsOutput()), undefined elsewhere.
  virtual at::Tensor evalForward(const at::Tensor& input, MicroBatchOps& ops);
  bool holdsOutput() const { return mesh_.lastStage(); }
  // On the ranks that hold the output: the mean cross-entropy (float32) of
  // `output` ([..., classes]: a language model's [B, T, vocab]) against
  // `labels` ([...]), with `labelSmoothing`; the same on every rank of a
  // tensor group, whose ranks hold slices of the classes (collective
  // there).
  virtual at::Tensor outputLoss(const at::Tensor& output, const at::Tensor& labels, double labelSmoothing);
  // Evaluation's counts of `output` against `labels` (as outputLoss).
  virtual OutputScore scoreOutput(const at::Tensor& output, const at::Tensor& labels);

  virtual CheckpointRole checkpointRole() const;
  // A model split over a tensor group: how, as each manifest records it
  // (extra.tensor, ckpt::CheckpointTensors): the ranks, sequence
  // parallelism, and the cut of every split tensor of the state dict. Null
  // otherwise.
  virtual nlohmann::json tensorLayout() const { return nullptr; }
  // A model split over a tensor group: what the split's exchanges carried
  // in the training rounds so far on this rank (sums and all-gathers, their
  // calls and bytes; parallel::tensorExchanges), for summary.json. Null
  // otherwise.
  virtual nlohmann::json splitStats() const { return nullptr; }
  // ZeRO (stats().zeroStage > 0): how the optimizer state is cut into
  // parts, as each manifest records it (extra.zero): the stage, the
  // replicas, the buckets' parameter names, each trainable parameter's
  // shape and strides. Null without ZeRO.
  nlohmann::json zeroLayout() const;
  // Which elements of the trainable parameters each of
  // optimizerParameters() holds (ckpt::partsFromWhole cuts a checkpoint's
  // state with them).
  virtual std::vector<std::vector<ckpt::PartSlice>> optimizerSlices() const;
  // ZeRO stage 3: the parameters whose values this rank holds only as its
  // parts (optimizerParameters()); a checkpoint writes the parts instead.
  std::vector<std::string> parametersInParts() const;

  // A model held in parts (ZeRO stage 3, docs/zero.md), written by the
  // job's rank 0 to `path` (in `format`, sealed with `key` if set) in the
  // published state dict's order: each unit's trainable and frozen buckets
  // gathered on it together, written and released before the next (the
  // other ranks send their parts), then the rest (buffers, tied names). No
  // process holds the whole model. Collective. Returns rank 0's peak
  // resident MB (0 elsewhere). (unit_writes.cc)
  double writeByUnit(const std::string& path, WeightsFormat format, const security::Key* key,
                     const UnitWrite& what);
  // models::frozenDigest of a model whose frozen parameters are held in
  // parts (DdpOptions::shardFrozen): every rank gathers each frozen unit in
  // turn and hashes the parameters in the model's order, the same bytes as
  // frozenDigest. Collective.
  std::string frozenDigestByUnit();

  // The final save (model/final.pt): gatherForSave() brings what the job's
  // rank 0 reads (ZeRO stage 3: every parameter, until releaseParameters());
  // then collect(publish) returns, on rank 0, `publish` of the whole model
  // (models::publishedStateDict, or LoRA's dicts): this rank's model, or
  // every stage's put together in order, a tensor two stages hold (the tied
  // embedding) once. Empty on the other ranks. Both are collective.
  using Publish = std::function<ckpt::StateDict(const models::Model&)>;
  virtual void gatherForSave();
  ckpt::StateDict collect(const Publish& publish);
  // collect(), tensor by tensor: on the job's rank 0, `visit` sees each
  // tensor of the whole model once, in order; one received from another
  // stage is dropped after its visit, so rank 0 holds no more than its own
  // part and one tensor (model/final.pt written as it arrives).
  using Visit = std::function<void(const std::string& name, const at::Tensor& t)>;
  virtual void visitCollected(const Publish& publish, const Visit& visit);
  void releaseParameters();

 protected:
  Mesh mesh_;
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<DistributedDataParallel> engine_;
};

// The plan of a mesh with one stage: data parallelism over the whole model.
std::unique_ptr<Plan> dataParallel(Mesh mesh, std::shared_ptr<models::Model> model,
                                   DdpOptions options);

// The plan of a mesh with one stage split over its tensor group
// (parallel/tensor_plan.cc): `model` is this rank's slices
// (createTensorParallelGpt over mesh.tensor), and data parallelism (ZeRO
// 0-2) runs among the ranks holding the same slice (mesh.data).
std::unique_ptr<Plan> tensorParallel(Mesh mesh, std::shared_ptr<models::Model> model, DdpOptions options);

}  // namespace cohort::parallel
