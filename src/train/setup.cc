#include "train/detail/setup.h"

#include "cohort/core/env.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/zero_state.h"
#include "cohort/core/checksum.h"
#include "cohort/core/cpu.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/data/transform.h"
#include "cohort/models/pretrained.h"
#include "cohort/models/pretrained.h"
#include "cohort/models/lora.h"
#include "cohort/ckpt/rank_state.h"
#include "cohort/models/gpt.h"
#include "cohort/parallel/tensor_gpt.h"
#include "cohort/parallel/tensor_llama.h"
#include "cohort/parallel/unit_load.h"
#include "cohort/security/keys.h"
#include "cohort/storage/storage.h"
#include "cohort/train/lr_schedule.h"
#include "cohort/train/precision.h"
#include "cohort/train/trainer.h"
#include "core/detail/json_int.h"

namespace cohort::train::detail {

namespace {

// A TorchScript module's forward, tried on one sample of the job's shape:
// logits [1, num_classes] for images, [1, block_size, >= vocab] for tokens.
void probeScriptedModel(models::Model& model, const ModelConfig& mc, const Datasets& data) {
  const bool tokens = data.vocabSize > 0;
  const data::SampleShape& shape = data.shape;
  const at::Tensor x = tokens ? torch::zeros({1, mc.blockSize}, torch::kLong)
                              : torch::zeros({1, shape.channels, shape.height, shape.width});
  const std::string input = tokens ? fmt::format("tokens [1, {}]", mc.blockSize)
                                   : fmt::format("images [1, {}, {}, {}]", shape.channels,
                                                 shape.height, shape.width);
  at::Tensor y;
  {
    torch::NoGradGuard noGrad;
    model.eval();
    try {
      y = model.forward(x);
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      throw ConfigError(fmt::format("model.path: {}: forward fails on {}: {}", mc.path, input,
                                    what.substr(0, what.find('\n'))));
    }
    model.train();
  }
  const std::vector<int64_t> got = y.sizes().vec();
  const bool ok = tokens ? y.dim() == 3 && got[0] == 1 && got[1] == mc.blockSize && got[2] >= data.vocabSize
                         : y.dim() == 2 && got[0] == 1 && got[1] == mc.numClasses;
  if (!ok || !y.is_floating_point()) {
    throw ConfigError(fmt::format(
        "model.path: {}: forward maps {} to {} of shape [{}], but the job needs logits {}", mc.path,
        input, std::string(c10::toString(y.scalar_type())), fmt::join(got, ", "),
        tokens ? fmt::format("[1, {}, vocab >= {}] (next-token scores for every position)",
                             mc.blockSize, data.vocabSize)
               : fmt::format("[1, {}] (model.num_classes)", mc.numClasses)));
  }
}

}  // namespace

Datasets openDatasets(const JobConfig& job) {
  data::OpenOptions openOptions;
  openOptions.storage = storage::storageOptions(job.storage);
  openOptions.cache = job.data.cache;
  openOptions.training = true;
  // A next-token model's window holds its targets' last token too.
  if (tokenModel(job)) openOptions.tokenWindow = job.model.blockSize + (maskedLm(job) ? 0 : 1);
  if (textClassifier(job)) openOptions.tokenWindow = job.model.blockSize;
  Datasets d;
  d.train = data::openDataset(job.data.train, job.model.numClasses, openOptions);
  openOptions.training = false;
  if (job.data.eval.kind != DataKind::none) {
    d.eval = data::openDataset(job.data.eval, job.model.numClasses, openOptions);
  }
  d.shape = d.train->shape();
  d.vocabSize = d.train->vocabSize();
  if (maskedLm(job)) {
    for (const char* mask : {"[MASK]", "<mask>"}) {
      if (d.maskId < 0) d.maskId = d.train->tokenId(mask);
    }
    if (d.maskId < 0) {
      throw DataError(fmt::format("{}: its tokenizer has no [MASK] (or <mask>) token, which model.task masked_lm "
                                  "puts in place of the tokens it hides; tokenize with a BERT vocab.txt or a "
                                  "tokenizer.json that has one",
                                  job.data.train.path));
    }
  }
  if (job.model.arch == ModelArch::bert) d.padId = d.train->tokenId("[PAD]");
  if (d.eval) {
    const data::SampleShape es = d.eval->shape();
    const data::SampleShape& ts = d.shape;
    if (es.channels != ts.channels || es.height != ts.height || es.width != ts.width) {
      throw DataError(fmt::format("evaluation samples are {}x{}x{} but training samples are {}x{}x{}",
                                  es.channels, es.height, es.width, ts.channels, ts.height,
                                  ts.width));
    }
    if (d.eval->vocabSize() != d.vocabSize) {
      throw DataError(fmt::format("evaluation tokens have a vocabulary of {} but training tokens of {} "
                                  "(tokenized differently)", d.eval->vocabSize(), d.vocabSize));
    }
  }
  log::info("training data: {}", d.train->describe());
  if (d.eval) log::info("evaluation data: {}", d.eval->describe());
  return d;
}

ModelConfig resolveModelConfig(const JobConfig& job, const Datasets& data) {
  const data::SampleShape& shape = data.shape;
  ModelConfig mc = job.model;
  if (decoderArch(mc.arch) || mc.arch == ModelArch::bert) {
    mc.padToken = data.padId;
    if (mc.vocabSize == 0) mc.vocabSize = data.vocabSize;
    if (mc.vocabSize < data.vocabSize) {
      throw ConfigError(fmt::format("model.vocab_size is {} but the training data's tokenizer has {} "
                                    "tokens", mc.vocabSize, data.vocabSize));
    }
  } else {
    if (mc.inChannels == 0) mc.inChannels = shape.channels;
    if (mc.inChannels != shape.channels) {
      throw ConfigError(fmt::format("model.in_channels is {} but the training data has {} channels",
                                    mc.inChannels, shape.channels));
    }
  }
  if (mc.arch == ModelArch::torchscript && mc.vocabSize == 0) mc.vocabSize = data.vocabSize;
  return mc;
}

bool buildsByUnit(const JobConfig& job) {
  // A tensor split builds its slices (1/T of each block) and shards them after.
  return job.distribution.zero == 3 && decoderArch(job.model.arch) && job.distribution.tensor == 1;
}

namespace {

// The whole model's tensors of `whole` as a tensor split's rank `rank` of
// `tensors` holds them (parallel::tensorCut): each split one's region
// read from the files that hold it, one tensor at a time.
class SlicedTensors : public ckpt::TensorSource {
 public:
  SlicedTensors(ckpt::CheckpointTensors& whole, int tensors, int rank) : whole_(whole), tensors_(tensors), rank_(rank) {
    for (const auto& [name, t] : whole.entries()) {
      const parallel::TensorCut cut = parallel::tensorCut(name);
      std::vector<int64_t> shape = t.sizes().vec();
      if (cut.split() && tensors > 1) shape[static_cast<size_t>(cut.dim)] /= tensors;
      entries_.emplace_back(name, ckpt::withoutData(shape, t.scalar_type()));
    }
  }
  const ckpt::StateDict& entries() const override { return entries_; }
  at::Tensor load(const std::string& name) override {
    const parallel::TensorCut cut = parallel::tensorCut(name);
    if (tensors_ == 1 || !cut.split()) return whole_.load(name);
    return whole_.loadRegion(name, cut.dim, cut.blocks, tensors_, rank_);
  }
  void drop(const std::string& name) override { whole_.drop(name); }

 private:
  ckpt::CheckpointTensors& whole_;
  int tensors_, rank_;
  ckpt::StateDict entries_;
};

}  // namespace

ModelSetup buildModel(const JobConfig& job, const Datasets& data, const parallel::Mesh& mesh,
                      const std::string& resumeFrom, const models::ModelPart& part, bool restaged) {
  const comm::Comm& comm = mesh.data;
  const int stage = mesh.stage;
  const data::SampleShape& shape = data.shape;
  ModelSetup s;
  // Identical initialization everywhere (rank 0's is broadcast anyway).
  torch::manual_seed(static_cast<uint64_t>(job.training.seed));
  ModelConfig& mc = s.config;
  mc = resolveModelConfig(job, data);
  models::ModelPart built = part;
  if (buildsByUnit(job)) {
    s.units = std::make_shared<parallel::UnitParts>(comm.worldSize, comm.rank);
    built.sink = s.units.get();
  }
  if (mesh.tensorSplit()) {
    // This rank's slices, drawn as the whole model of the seed draws them.
    parallel::TensorSplitOptions split;
    split.sequenceParallel = job.distribution.sequenceParallel;
    if (job.distribution.sharedMemory) {
      // The largest activation a sum carries ([batch, block_size, n_embd]),
      // at most 64 MB: a bigger one goes through in pieces.
      const int64_t batch = std::max(job.training.batchSize, evalBatchSize(job));
      split.sharedMemoryFloats = std::clamp<int64_t>(batch * mc.blockSize * mc.nEmbd, int64_t{1} << 12, int64_t{1} << 24);
    }
    s.model = mc.arch == ModelArch::llama
                  ? parallel::createTensorParallelLlama(models::llamaOptions(mc, mc.vocabSize), mesh.tensor, split,
                                                        c10::nullopt, part)
                  : parallel::createTensorParallelGpt(models::gptOptions(mc, mc.vocabSize), mesh.tensor, split,
                                                      c10::nullopt, part);
  } else {
    s.model = models::createModel(mc, {mc.inChannels, shape.height, shape.width}, built);
  }
  models::Model& model = *s.model;
  if (s.units) {
    // No broadcast sends these: every rank drew them from the same seed.
    comm::checkAgreement(comm, "initial parameters (built unit by unit, ZeRO stage 3)", s.units->digest());
    log::info("ZeRO stage 3: built the model unit by unit: {} units, the largest {:.1f} MB; this rank "
              "keeps {:.1f} MB of their parameters",
              s.units->units(), double(s.units->largestUnitBytes()) / 1e6, double(s.units->partBytes()) / 1e6);
  }
  if (mc.arch == ModelArch::torchscript) probeScriptedModel(model, mc, data);
  const bool lora = mc.lora.rank > 0;
  s.trainable = models::parameterCount(model);
  if (lora) {
    // A LoRA run's frozen weights are model.init_from's, resumed or not;
    // its checkpoints hold only what trains.
    if (mc.initFrom.empty()) {
      log::warn("model.lora without model.init_from: the adapters train beside frozen random weights");
    }
    models::LoraSummary ls;
    if (s.units) {
      // ZeRO stage 3: the base is kept in parts as it was built, and
      // model.init_from read into them one unit at a time; the adapters
      // then train beside it, built whole (they are small).
      if (!mc.initFrom.empty()) {
        const auto file = models::openPretrained(mc.initFrom, mc);
        parallel::loadByUnit(model, *s.units, file->entries(), mc.initFrom, file.get());
      }
      s.frozenUnits = std::move(s.units);
      ls = models::attachLora(model, mc.lora);
    } else {
      ls = models::loadFrozenBase(model, mc);
    }
    if (!mc.initFrom.empty()) {
      log::info("initialized from {} (frozen{})", mc.initFrom, s.frozenUnits ? ", one unit at a time" : "");
    }
    s.trainable = ls.trainable;
    log::info("LoRA rank {} (alpha {}) on {} layers: {} parameters train, {} are frozen", mc.lora.rank,
              mc.lora.alpha, ls.layers.size(), ls.trainable, ls.frozen);
  }
  {
    // Same job file, different code or data could still build different
    // models; the ranks would then exchange mismatched gradients.
    Hasher h;
    int64_t tensors = 0, values = 0;
    for (const auto& [name, t] : ckpt::stateDict(model)) {
      h.update(name.data(), name.size());
      h.update(t.sizes().data(), t.sizes().size() * sizeof(int64_t));
      ++tensors;
      values += t.numel();
    }
    comm::checkAgreement(comm, "model (names and shapes of its tensors)",
                         fmt::format("{} tensors, {} values, digest {}", tensors, values, h.hex()));
  }
  if (!lora && !mc.initFrom.empty() && resumeFrom.empty() && s.units) {
    // One unit's tensors read at a time.
    const auto file = models::openPretrained(mc.initFrom, mc);
    ckpt::StateDict weights = file->entries();
    if (!part.whole()) weights = models::partOfStateDict(model, std::move(weights));
    parallel::loadByUnit(model, *s.units, std::move(weights), mc.initFrom, file.get());
    log::info("initialized from {}, one unit at a time", mc.initFrom);
  } else if (!lora && !mc.initFrom.empty() && resumeFrom.empty() && !part.whole()) {
    // A pipeline stage reads its own tensors only, one at a time.
    const auto file = models::openPretrained(mc.initFrom, mc);
    models::loadWeights(model, *file, mc.initFrom, /*part=*/true);
    log::info("initialized from {} (this stage's tensors)", mc.initFrom);
  } else if (!lora && !mc.initFrom.empty() && resumeFrom.empty()) {
    const auto file = models::openPretrained(mc.initFrom, mc);  // one tensor at a time: no second copy
    models::loadWeights(model, *file, mc.initFrom);
    log::info("initialized from {}", mc.initFrom);
  }
  if (!resumeFrom.empty() && restaged) {
    // Another layout's stages: this part's tensors, one at a time, from
    // whichever of them hold them (a ZeRO stage 3 checkpoint's parts put
    // together bucket by bucket).
    ckpt::CheckpointTensors checkpoint(resumeFrom, ckpt::readManifest(resumeFrom));
    SlicedTensors sliced(checkpoint, mesh.tensors, mesh.tensorRank);
    ckpt::TensorSource& source = mesh.tensorSplit() ? static_cast<ckpt::TensorSource&>(sliced) : checkpoint;
    ckpt::StateDict entries = source.entries();
    if (!part.whole()) entries = models::partOfStateDict(model, std::move(entries));
    if (s.units) {
      // ZeRO stage 3, built unit by unit: each unit's tensors read and cut
      // into this rank's part before the next.
      parallel::loadByUnit(model, *s.units, std::move(entries), resumeFrom, &source);
    } else {
      ckpt::loadStateDict(models::trainedState(model), source, entries, resumeFrom);
    }
    log::info("restaged: read {:.3g} MB of the checkpoint's model files for this rank's part (its whole model: "
              "{:.3g} MB)",
              double(checkpoint.bytesRead()) / 1e6, double(checkpoint.bytesWhole()) / 1e6);
  } else if (!resumeFrom.empty() && s.units) {
    // kept out of a pipeline's buckets (makePlan)
    const std::vector<std::string> tied = part.whole() ? std::vector<std::string>{} : models::tiedAcrossStages(mc);
    parallel::resumeByUnit(model, *s.units, resumeFrom, ckpt::readManifest(resumeFrom), stage, comm, tied);
  } else if (!resumeFrom.empty()) {
    // model.bin (a pipeline stage's file), with ZeRO stage 3's parameter
    // parts put back together.
    ckpt::loadStateDict(models::trainedState(model),
                        ckpt::stageModel(resumeFrom, ckpt::readManifest(resumeFrom), stage, mesh.tensorRank),
                        resumeFrom + "/" + ckpt::sliceFile(mesh.tensorRank, mesh.tensors,
                                                           ckpt::stageFile(stage, mesh.stages, "model.bin")));
  }
  model.to(comm.device);
  const TrainingConfig& tc = job.training;
  const PrecisionChoice precision = resolvePrecision(tc.precision, cpuInfo());
  s.precision = precision.precision;
  log::info("precision {} ({})", choiceName(s.precision), precision.reason);
  if (!oneDnnNote().empty()) log::info("{}", oneDnnNote());
  const MemoryFormatChoice layout =
      part.whole() || mc.memoryFormat != MemoryLayout::automatic
          ? chooseMemoryFormat(model, mc, tc.batchSize, shape.channels, shape.height, shape.width, comm,
                               s.precision)
          : MemoryFormatChoice{model.channelsLast() ? "channels_last" : "contiguous",
                               "a pipeline stage: the model's default (no trial input fits a stage)"};
  s.compute = observeCompute();
  // Measured with the memory format (auto); a given memory format fixes
  // the kernels (runs compared by their weights take the same ones), and a
  // pipeline stage has no trial input: there the rule decides.
  s.compute.convProducts =
      !part.whole() ? "the rule (a pipeline stage: no trial input fits a stage)"
      : mc.memoryFormat != MemoryLayout::automatic
          ? "the rule (model.memory_format is given: nothing measured)"
          : chooseConvProducts(model, tc.batchSize, shape.channels, shape.height, shape.width, comm, s.precision);
  s.compute.memoryFormat = layout.format;
  s.compute.memoryFormatReason = layout.reason;
  s.compute.precision = choiceName(s.precision);
  s.compute.precisionReason = precision.reason;
  log::info("{}", describe(s.compute));
  if (machineBusy(s.compute, env::availableCores()) && s.compute.intraOpThreads > 1) {
    log::warn("the machine is busy: load average {:.1f} on the {} core(s) this rank may use, before this job's "
              "work; its {} thread(s) share cores with other work (OpenMP wait: {}). Fewer threads per rank "
              "(distribution.threads_per_rank) may be faster",
              s.compute.loadAverage, env::availableCores(), s.compute.intraOpThreads, s.compute.openMpWait);
  }
  s.parameters = models::parameterCount(model);
  if (mesh.tensorSplit()) {
    log::info("model {}: {} parameters in this rank's slices ({})", choiceName(mc.arch), s.parameters,
              mesh.describe());
  } else {
    log::info("model {}: {} parameters", choiceName(mc.arch), s.parameters);
  }
  if (lora && !s.frozenUnits) s.frozenDigest = models::frozenDigest(model);
  return s;
}

parallel::DdpOptions ddpOptions(const JobConfig& job) {
  const DistributionConfig& dc = job.distribution;
  parallel::DdpOptions o;
  o.bucketCapMb = dc.bucketCapMb;
  o.findUnusedParameters = dc.findUnusedParameters;
  o.broadcastBuffers = dc.broadcastBuffers;
  o.divideGradients = false;
  o.sharedMemory = dc.sharedMemory;
  o.zeroStage = static_cast<int>(dc.zero);
  using C = parallel::DdpOptions::Compression;
  switch (dc.compression) {
    case GradCompression::none: o.compression = C::none; break;
    case GradCompression::fp16: o.compression = C::fp16; break;
    case GradCompression::bf16: o.compression = C::bf16; break;
  }
  return o;
}

}  // namespace cohort::train::detail

namespace cohort::train {

parallel::MeshShape meshShape(const JobConfig& job) {
  parallel::MeshShape shape;
  shape.stages = static_cast<int>(job.distribution.pipeline.stages);
  shape.tensors = static_cast<int>(job.distribution.tensor);
  return shape;
}

}  // namespace cohort::train

namespace cohort::train::detail {

std::string finalModelPath(const JobConfig& job, const RunDir& runDir) {
  return job.output.weightsFormat == WeightsFormat::safetensors ? runDir.finalSafetensors() : runDir.finalModel();
}

const security::Key* finalModelKey(const JobConfig& job) {
  const security::Keyring* keys = security::installedKeyring();
  return keys != nullptr && job.security.encryption.finalModel ? &keys->current : nullptr;
}

int64_t evalBatchSize(const JobConfig& job) {
  if (job.data.eval.kind == DataKind::none) return 0;
  return job.data.evalBatchSize > 0 ? job.data.evalBatchSize : 2 * job.training.batchSize;
}

Loaders makeLoaders(const JobConfig& job, const Datasets& data, int dataRank, int dataWorld) {
  const TrainingConfig& tc = job.training;
  Loaders l;
  data::SamplerOptions so;
  so.size = data.train->size();
  so.worldSize = dataWorld;
  so.rank = dataRank;
  so.shuffle = true;
  so.seed = static_cast<uint64_t>(tc.seed);
  so.evenSplit = true;
  // Elastic: every sample of an epoch once, across resizes.
  so.exactTail = env::elasticStateDir().has_value();
  so.order = [set = data.train, seed = so.seed](int64_t epoch) { return set->shuffledOrder(seed, epoch); };
  l.trainSampler = std::make_unique<data::DistributedSampler>(so);
  if (l.trainSampler->samplesPerRank() == 0) {
    throw DataError(fmt::format("{} training samples cannot be split over {} ranks",
                                data.train->size(), dataWorld));
  }
  data::LoaderOptions lo;
  lo.batchSize = tc.batchSize;
  lo.threads = static_cast<int>(job.data.loaderThreads);
  lo.prefetch = static_cast<int>(job.data.prefetchBatches);
  lo.dropLast = job.data.dropLast;
  lo.absorbTail = so.exactTail;
  lo.seed = static_cast<uint64_t>(tc.seed);
  lo.transform = data::Transform::fromConfig(job.data.train, data.shape, true, "data.train");
  lo.maskId = data.maskId;
  lo.vocabSize = data.vocabSize;
  l.train = std::make_unique<data::BatchLoader>(data.train, lo);
  if (data.eval) {
    data::SamplerOptions eo = so;
    eo.order = nullptr;
    eo.size = data.eval->size();
    eo.shuffle = false;
    eo.evenSplit = false;
    l.evalSampler = std::make_unique<data::DistributedSampler>(eo);
    data::LoaderOptions el = lo;
    el.batchSize = evalBatchSize(job);
    el.dropLast = false;
    el.transform = data::Transform::fromConfig(job.data.eval, data.shape, false, "data.eval");
    l.eval = std::make_unique<data::BatchLoader>(data.eval, el);
  }
  return l;
}

StepPlan StepPlan::takenUpWith(int64_t perRankLeft, int64_t hereLeft) const {
  StepPlan p = *this;
  p.perRank = perRankLeft;
  p.perRankHere = hereLeft;
  p.batchesPerEpoch = dropLast ? perRankLeft / batchSize : (perRankLeft + batchSize - 1) / batchSize;
  p.stepsPerEpoch = (p.batchesPerEpoch + accumulate - 1) / accumulate;
  return p;
}

ResumeAt resumePosition(const ckpt::Manifest& m, const JobConfig& job, int worldSize,
                        int64_t datasetSize) {
  ResumeAt at;
  at.epoch = m.epoch;
  // A checkpoint that does not record its batch size (written before it
  // could change) is taken to have this run's; checkResumable refuses
  // another batch size for it. Without epoch_done, one written at the end
  // of its epoch under data.drop_last and resumed in another layout trains
  // the few samples that epoch had dropped.
  const bool sameLayout = m.worldSize == worldSize &&
                          jsonInt(m.extra, "epoch_start", int64_t{0}) == 0 &&
                          jsonInt(m.extra, "batch_size", job.training.batchSize) == job.training.batchSize &&
                          jsonInt(m.extra, "accumulate", microBatchesPerStep(job)) ==
                              microBatchesPerStep(job);
  if (sameLayout) {
    at.batch = m.batchInEpoch;
    return at;
  }
  at.relaid = true;
  at.from = m.extra.value("epoch_done", false) ? datasetSize : m.samplesInEpoch;
  return at;
}

Cycle StepPlan::cycleOf(int64_t micro) const {
  Cycle c;
  c.first = (micro / accumulate) * accumulate;
  c.length = std::min(accumulate, batchesPerEpoch - c.first);
  // The last cycle takes whatever this rank has left (one sample more than
  // the others, with an exact tail).
  const bool last = c.first + c.length == batchesPerEpoch && !dropLast;
  c.samples = (last ? perRankHere : std::min(perRankHere, (c.first + c.length) * batchSize)) -
              c.first * batchSize;
  c.last = micro - c.first == c.length - 1;
  return c;
}

StepPlan planSteps(const JobConfig& job, int64_t perRank, int worldSize, int64_t perRankHere) {
  const TrainingConfig& tc = job.training;
  StepPlan p;
  p.batchSize = tc.batchSize;
  p.accumulate = microBatchesPerStep(job);
  p.perRank = perRank;
  p.perRankHere = perRankHere >= 0 ? perRankHere : perRank;
  p.batchesPerEpoch =
      job.data.dropLast ? perRank / tc.batchSize : (perRank + tc.batchSize - 1) / tc.batchSize;
  if (p.batchesPerEpoch == 0) {
    throw DataError(fmt::format(
        "each rank gets {} training samples, fewer than one batch of {} (data.drop_last is set)",
        perRank, tc.batchSize));
  }
  p.stepsPerEpoch = (p.batchesPerEpoch + p.accumulate - 1) / p.accumulate;
  p.totalSteps = p.stepsPerEpoch * tc.epochs;
  if (tc.maxSteps > 0) p.totalSteps = std::min(p.totalSteps, tc.maxSteps);
  p.dropLast = job.data.dropLast;
  p.globalBatch = tc.batchSize * worldSize * p.accumulate;
  p.peakLr = peakLearningRate(tc.optimizer, p.globalBatch);
  return p;
}

}  // namespace cohort::train::detail
