#pragma once

// How the model of a job is spread over its ranks: the one interface the
// training loop talks to (docs/parallelism.md). A plan answers
//
//   what this rank holds      model(): the whole model, or its pipeline stage
//   what it optimizes         optimizerParameters(), optimizerNames()
//   how a step's micro-       runRound(): a round of micro-batches forward and
//     batches run               backward in the plan's schedule (one micro-
//                               batch, as accumulation always ran; 1F1B or
//                               GPipe across the stages of a pipeline)
//   how gradients are         finishGradients(), gradientsFinite(),
//     finished                  gradientSquaredNorm(), scaleGradients(),
//                               afterOptimizerStep(), zeroGrad()
//   which files a checkpoint  checkpointRole(): the stage's file names, and
//     writes                    whether this rank writes the shared ones
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

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/models/model.h"
#include "cohort/parallel/ddp.h"
#include "cohort/parallel/mesh.h"

namespace cohort::parallel {

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

// The files of a checkpoint this rank writes (ckpt/rank_state.h names them).
struct CheckpointRole {
  int stage = 0;
  int stages = 1;             // > 1: every file name carries the stage (ckpt::stageFile)
  int dataRank = 0;           // the index of this rank's ZeRO part files
  bool writesShared = false;  // the stage's model file (and the unsharded optimizer's)
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
  // The data-parallel engine over this rank's part, among its data group.
  DistributedDataParallel& engine() { return *engine_; }
  const DistributedDataParallel& engine() const { return *engine_; }

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

  virtual CheckpointRole checkpointRole() const;

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

}  // namespace cohort::parallel
