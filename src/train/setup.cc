#include "train/detail/setup.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/checksum.h"
#include "cohort/core/cpu.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/data/transform.h"
#include "cohort/storage/storage.h"
#include "cohort/train/lr_schedule.h"
#include "cohort/train/precision.h"

namespace cohort::train::detail {

Datasets openDatasets(const JobConfig& job) {
  data::OpenOptions openOptions;
  openOptions.storage = storage::storageOptions(job.storage);
  openOptions.cache = job.data.cache;
  openOptions.training = true;
  if (job.model.arch == ModelArch::gpt) openOptions.tokenWindow = job.model.blockSize + 1;
  Datasets d;
  d.train = data::openDataset(job.data.train, job.model.numClasses, openOptions);
  openOptions.training = false;
  if (job.data.eval.kind != DataKind::none) {
    d.eval = data::openDataset(job.data.eval, job.model.numClasses, openOptions);
  }
  d.shape = d.train->shape();
  d.vocabSize = d.train->vocabSize();
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

ModelSetup buildModel(const JobConfig& job, const Datasets& data, const comm::Comm& comm,
                      const std::string& resumeFrom) {
  const data::SampleShape& shape = data.shape;
  ModelSetup s;
  // Identical initialization everywhere (rank 0's is broadcast anyway).
  torch::manual_seed(static_cast<uint64_t>(job.training.seed));
  ModelConfig& mc = s.config;
  mc = job.model;
  if (mc.arch == ModelArch::gpt) {
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
  s.model = models::createModel(mc, {mc.inChannels, shape.height, shape.width});
  models::Model& model = *s.model;
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
  if (!resumeFrom.empty()) {
    const std::string file = resumeFrom + "/model.bin";
    ckpt::loadStateDict(model, ckpt::readTensorFile(file).tensors, file);
  } else if (!mc.initFrom.empty()) {
    models::loadWeights(model, ckpt::readStateDict(mc.initFrom), mc.initFrom);
    log::info("initialized from {}", mc.initFrom);
  }
  model.to(comm.device);
  const TrainingConfig& tc = job.training;
  const PrecisionChoice precision = resolvePrecision(tc.precision, cpuInfo());
  s.precision = precision.precision;
  log::info("precision {} ({})", choiceName(s.precision), precision.reason);
  const auto layout = chooseMemoryFormat(model, mc, tc.batchSize, shape.channels, shape.height,
                                         shape.width, comm, s.precision);
  s.compute = observeCompute();
  s.compute.memoryFormat = layout.format;
  s.compute.memoryFormatReason = layout.reason;
  s.compute.precision = choiceName(s.precision);
  s.compute.precisionReason = precision.reason;
  log::info("{}", describe(s.compute));
  s.parameters = models::parameterCount(model);
  log::info("model {}: {} parameters", choiceName(mc.arch), s.parameters);
  return s;
}

ddp::DdpOptions ddpOptions(const JobConfig& job) {
  const DistributionConfig& dc = job.distribution;
  ddp::DdpOptions o;
  o.bucketCapMb = dc.bucketCapMb;
  o.findUnusedParameters = dc.findUnusedParameters;
  o.broadcastBuffers = dc.broadcastBuffers;
  o.divideGradients = false;
  o.sharedMemory = dc.sharedMemory;
  using C = ddp::DdpOptions::Compression;
  switch (dc.compression) {
    case GradCompression::none: o.compression = C::none; break;
    case GradCompression::fp16: o.compression = C::fp16; break;
    case GradCompression::bf16: o.compression = C::bf16; break;
  }
  return o;
}

Loaders makeLoaders(const JobConfig& job, const Datasets& data, const comm::Comm& comm) {
  const TrainingConfig& tc = job.training;
  Loaders l;
  data::SamplerOptions so;
  so.size = data.train->size();
  so.worldSize = comm.worldSize;
  so.rank = comm.rank;
  so.shuffle = true;
  so.seed = static_cast<uint64_t>(tc.seed);
  so.evenSplit = true;
  so.order = [set = data.train, seed = so.seed](int64_t epoch) { return set->shuffledOrder(seed, epoch); };
  l.trainSampler = std::make_unique<data::DistributedSampler>(so);
  if (l.trainSampler->samplesPerRank() == 0) {
    throw DataError(fmt::format("{} training samples cannot be split over {} ranks",
                                data.train->size(), comm.worldSize));
  }
  data::LoaderOptions lo;
  lo.batchSize = tc.batchSize;
  lo.threads = static_cast<int>(job.data.loaderThreads);
  lo.prefetch = static_cast<int>(job.data.prefetchBatches);
  lo.dropLast = job.data.dropLast;
  lo.seed = static_cast<uint64_t>(tc.seed);
  lo.transform = data::Transform::fromConfig(job.data.train, data.shape, true, "data.train");
  l.train = std::make_unique<data::BatchLoader>(data.train, lo);
  if (data.eval) {
    data::SamplerOptions eo = so;
    eo.order = nullptr;
    eo.size = data.eval->size();
    eo.shuffle = false;
    eo.evenSplit = false;
    l.evalSampler = std::make_unique<data::DistributedSampler>(eo);
    data::LoaderOptions el = lo;
    el.batchSize = job.data.evalBatchSize > 0 ? job.data.evalBatchSize : 2 * tc.batchSize;
    el.dropLast = false;
    el.transform = data::Transform::fromConfig(job.data.eval, data.shape, false, "data.eval");
    l.eval = std::make_unique<data::BatchLoader>(data.eval, el);
  }
  return l;
}

Cycle StepPlan::cycleOf(int64_t micro) const {
  Cycle c;
  c.first = (micro / accumulate) * accumulate;
  c.length = std::min(accumulate, batchesPerEpoch - c.first);
  c.samples = std::min(perRank, (c.first + c.length) * batchSize) - c.first * batchSize;
  c.last = micro - c.first == c.length - 1;
  return c;
}

StepPlan planSteps(const JobConfig& job, int64_t perRank, int worldSize) {
  const TrainingConfig& tc = job.training;
  StepPlan p;
  p.batchSize = tc.batchSize;
  p.accumulate = tc.accumulateSteps;
  p.perRank = perRank;
  p.batchesPerEpoch =
      job.data.dropLast ? perRank / tc.batchSize : (perRank + tc.batchSize - 1) / tc.batchSize;
  if (p.batchesPerEpoch == 0) {
    throw DataError(fmt::format(
        "each rank gets {} training samples, fewer than one batch of {} (data.drop_last is set)",
        perRank, tc.batchSize));
  }
  p.stepsPerEpoch = (p.batchesPerEpoch + tc.accumulateSteps - 1) / tc.accumulateSteps;
  p.totalSteps = p.stepsPerEpoch * tc.epochs;
  if (tc.maxSteps > 0) p.totalSteps = std::min(p.totalSteps, tc.maxSteps);
  p.globalBatch = tc.batchSize * worldSize * tc.accumulateSteps;
  p.peakLr = peakLearningRate(tc.optimizer, p.globalBatch);
  return p;
}

}  // namespace cohort::train::detail
