#pragma once

// Setting up a rank from the resolved job, in the order train() calls it:
// the datasets, the model (with the weights it starts from), the exchange's
// options, the samplers and loaders, and the plan of steps.

#include <cstdint>
#include <memory>
#include <string>

#include "cohort/ckpt/manifest.h"
#include "cohort/comm/comm.h"
#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/data/dataset.h"
#include "cohort/data/loader.h"
#include "cohort/data/sampler.h"
#include "cohort/models/model.h"
#include "cohort/parallel/mesh.h"
#include "cohort/parallel/options.h"
#include "cohort/parallel/unit_parts.h"
#include "cohort/security/keys.h"
#include "cohort/train/compute.h"

namespace cohort::train::detail {

struct Datasets {
  std::shared_ptr<data::Dataset> train;
  std::shared_ptr<data::Dataset> eval;  // null with data.eval.kind: none
  data::SampleShape shape;              // of every sample, training and evaluation
  int64_t vocabSize = 0;                // token data: the tokenizer's
  int64_t maskId = -1;                  // masked language modelling: the tokenizer's [MASK]
  int64_t padId = -1;                   // bert: the tokenizer's [PAD], never attended to
};

// Opens data.train and data.eval (every rank opens them itself; they are
// read-only). Throws DataError when the evaluation samples' shape differs.
Datasets openDatasets(const JobConfig& job);

// ZeRO stage 3 on a model with sharding units (the GPT; with model.lora its
// frozen base is built and loaded unit by unit, the adapters whole).
bool buildsByUnit(const JobConfig& job);

struct ModelSetup {
  std::shared_ptr<models::Model> model;
  ModelConfig config;     // job.model with in_channels (images) or vocab_size (tokens) from the data
  ComputeState compute;   // as training starts, with the memory format chosen
  Precision precision = Precision::fp32;  // training.precision resolved: fp32, bf16 or fp16
  int64_t parameters = 0;
  int64_t trainable = 0;    // parameters that train (with model.lora: the adapters')
  // model.lora: models::frozenDigest (with frozenUnits, empty until the
  // plan can gather them: Plan::frozenDigestByUnit).
  std::string frozenDigest;
  // ZeRO stage 3 built unit by unit (buildsByUnit): this rank's parts,
  // for the engine (DdpOptions::presharded); null otherwise. With
  // model.lora, the frozen base's parts instead (frozenUnits, for
  // DdpOptions::frozenPresharded), and the adapters are built whole.
  std::shared_ptr<parallel::UnitParts> units;
  std::shared_ptr<parallel::UnitParts> frozenUnits;
};

// job.model with in_channels (images) or vocab_size (tokens) from the data;
// throws ConfigError when they disagree.
ModelConfig resolveModelConfig(const JobConfig& job, const Datasets& data);

// Builds this rank's `part` of the model (the whole model without a
// pipeline; with a tensor split its slices of it, parallel/tensor_gpt.h),
// seeded with training.seed so every rank starts alike; checks
// that every rank of mesh.data (the ranks that hold the same part) built the
// same tensors (CommError otherwise; unit by unit, the same values too);
// loads the part's tensors of
// <resumeFrom> (ckpt::stageModel), or else of model.init_from (both with
// model.lora, which this attaches); moves it to the device, resolves
// training.precision for this CPU and chooses its memory format in that
// precision (before DDP's buckets take the weights' strides; a pipeline
// stage keeps the model's default, as no trial input fits it).
// `restaged`: <resumeFrom> was written by other pipeline stages; the part's
// tensors are read one at a time from whichever of its stages hold them.
ModelSetup buildModel(const JobConfig& job, const Datasets& data, const parallel::Mesh& mesh,
                      const std::string& resumeFrom, const models::ModelPart& part = {}, bool restaged = false);

// The exchange's options from distribution.*. Gradients are not divided by
// the world size: the loss carries 1 / world instead (StepRunner).
parallel::DdpOptions ddpOptions(const JobConfig& job);

struct Loaders {
  std::unique_ptr<data::DistributedSampler> trainSampler;
  std::unique_ptr<data::BatchLoader> train;
  std::unique_ptr<data::DistributedSampler> evalSampler;  // null without evaluation
  std::unique_ptr<data::BatchLoader> eval;
};

// The training sampler (shuffled by training.seed and the epoch, an even
// split over the data ranks: this rank is `dataRank` of `dataWorld`, every
// stage of a pipeline replica alike) and loader, and the evaluation ones (in
// order, uneven). Throws DataError when the training set cannot be split
// over the data ranks.
Loaders makeLoaders(const JobConfig& job, const Datasets& data, int dataRank, int dataWorld);

// The evaluation loader's batch (data.eval_batch_size, or twice the
// training batch); 0 without evaluation data.
int64_t evalBatchSize(const JobConfig& job);

// The key model/ files are sealed with (security.encryption.final_model);
// null: none.
const security::Key* finalModelKey(const JobConfig& job);

// Where the trained weights go: model/final.pt, or model/final.safetensors
// (output.weights_format).
std::string finalModelPath(const JobConfig& job, const RunDir& runDir);

// One optimizer step's micro-batches (training.accumulate_steps) as seen
// from micro-batch `micro` of an epoch.
struct Cycle {
  int64_t first = 0;    // the step's first micro-batch
  int64_t length = 0;   // its micro-batches (the epoch's last step may have fewer)
  int64_t samples = 0;  // its samples on this rank (the epoch's last batch may be short)
  bool last = false;    // `micro` is the step's last micro-batch: the exchange runs
};

struct StepPlan {
  int64_t batchSize = 0;        // per rank and micro-batch
  int64_t accumulate = 1;       // micro-batches per optimizer step
  int64_t perRank = 0;          // training samples per rank and epoch (every rank's)
  // This rank's (elastic jobs: perRank + 1 on the ranks that take one of
  // an epoch's last samples; data::SamplerOptions::exactTail).
  int64_t perRankHere = 0;
  int64_t batchesPerEpoch = 0;  // micro-batches per rank and epoch
  int64_t stepsPerEpoch = 0;    // optimizer steps per epoch
  int64_t totalSteps = 0;       // of the run (training.epochs, capped by max_steps)
  int64_t globalBatch = 0;      // samples per optimizer step, all ranks
  double peakLr = 0;
  bool dropLast = false;

  Cycle cycleOf(int64_t micro) const;
  // The plan of an epoch taken up at a position of its order, with
  // `perRankLeft` samples left for each rank: its batches and steps (none
  // when nothing is left); the rest as this plan.
  StepPlan takenUpWith(int64_t perRankLeft, int64_t hereLeft) const;
};

// Throws DataError when a rank's share is less than one batch with
// data.drop_last. `perRankHere`: this rank's share (default: perRank).
StepPlan planSteps(const JobConfig& job, int64_t perRank, int worldSize, int64_t perRankHere = -1);

// Where a resumed run takes training up. With the checkpoint's layout (the
// same world size and batch size, an epoch begun at its start) it skips
// the checkpoint's batches of its epoch (`batch`), as ever. Otherwise the
// epoch goes on from the position of its order the checkpoint's ranks had
// reached together (`from`, ckpt::Manifest::samplesInEpoch; the whole
// order when that epoch was done), cut for this run's ranks
// (DistributedSampler::indices(epoch, from)): every sample the checkpoint's
// run had not trained on is trained on once, on whichever rank.
struct ResumeAt {
  int64_t epoch = 1;
  int64_t batch = 0;
  int64_t from = 0;
  bool relaid = false;  // `from` applies: another layout
};
ResumeAt resumePosition(const ckpt::Manifest& m, const JobConfig& job, int worldSize,
                        int64_t datasetSize);

}  // namespace cohort::train::detail
