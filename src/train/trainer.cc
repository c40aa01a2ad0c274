#include "cohort/train/trainer.h"

#include <fmt/format.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cohort/ckpt/state_dict.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/data/loader.h"
#include "cohort/data/sampler.h"
#include "cohort/ddp/ddp.h"
#include "cohort/models/model.h"
#include "cohort/monitor/progress.h"
#include "cohort/train/lr_schedule.h"
#include "cohort/train/optimizer.h"

namespace cohort::train {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct EvalResult {
  double top1 = 0, top5 = 0, loss = 0;
  int64_t samples = 0;
};

EvalResult evaluate(models::Model& model, data::BatchLoader& loader,
                    const data::DistributedSampler& sampler, const comm::Comm& comm,
                    int64_t numClasses) {
  torch::NoGradGuard noGrad;
  model.eval();
  loader.startEpoch(sampler.indices(0), 0);
  const int64_t k = std::min<int64_t>(5, numClasses);
  double lossSum = 0, correct1 = 0, correct5 = 0, count = 0;
  const c10::Device device = comm.device;
  while (auto batch = loader.next()) {
    const at::Tensor labels = batch->labels.to(device);
    at::Tensor logits = model.forward(batch->images.to(device));
    lossSum += torch::nn::functional::cross_entropy(
                   logits, labels,
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    at::Tensor top = std::get<1>(logits.topk(k, 1));
    at::Tensor hits = top.eq(labels.unsqueeze(1));
    correct1 += hits.select(1, 0).sum().item<double>();
    correct5 += hits.any(1).sum().item<double>();
    count += static_cast<double>(batch->labels.size(0));
  }
  at::Tensor sums = torch::tensor({lossSum, correct1, correct5, count}, torch::kFloat64);
  comm::allreduceSum(comm, sums, "evaluation results");
  auto s = sums.accessor<double, 1>();
  EvalResult r;
  r.samples = static_cast<int64_t>(s[3]);
  if (r.samples > 0) {
    r.loss = s[0] / s[3];
    r.top1 = s[1] / s[3];
    r.top5 = s[2] / s[3];
  }
  return r;
}

void injectFault(const std::optional<env::Fault>& fault, int rank, int64_t step) {
  if (!fault || fault->rank != rank || fault->step != step) return;
  if (fault->action == env::Fault::Action::kill) {
    log::warn("COHORT_FAULT: killing this rank with SIGKILL after step {}", step);
    log::flush();
    ::kill(::getpid(), SIGKILL);
  }
  log::warn("COHORT_FAULT: exiting with code {} after step {}", fault->exitCode, step);
  log::flush();
  std::_Exit(fault->exitCode);
}

}  // namespace

TrainSummary train(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir) {
  const TrainingConfig& tc = job.training;
  const int rank = comm.rank;
  const int world = comm.worldSize;
  const auto fault = env::fault();

  // Data. Every rank opens the datasets itself (they are read-only files).
  auto trainSet = data::openDataset(job.data.train, job.model.numClasses);
  std::shared_ptr<data::Dataset> evalSet;
  if (job.data.eval.kind != "none") evalSet = data::openDataset(job.data.eval, job.model.numClasses);
  const data::SampleShape shape = trainSet->shape();
  if (evalSet) {
    const data::SampleShape es = evalSet->shape();
    if (es.channels != shape.channels || es.height != shape.height || es.width != shape.width) {
      throw DataError(fmt::format("evaluation samples are {}x{}x{} but training samples are {}x{}x{}",
                                  es.channels, es.height, es.width, shape.channels, shape.height,
                                  shape.width));
    }
  }
  log::info("training data: {}", trainSet->describe());
  if (evalSet) log::info("evaluation data: {}", evalSet->describe());

  // Model: identical initialization everywhere (rank 0's is broadcast anyway).
  torch::manual_seed(static_cast<uint64_t>(tc.seed));
  ModelConfig mc = job.model;
  if (mc.inChannels == 0) mc.inChannels = shape.channels;
  if (mc.inChannels != shape.channels) {
    throw ConfigError(fmt::format("model.in_channels is {} but the training data has {} channels",
                                  mc.inChannels, shape.channels));
  }
  auto model = models::createModel(mc, {mc.inChannels, shape.height, shape.width});
  if (!mc.initFrom.empty()) {
    ckpt::loadStateDict(*model, ckpt::readStateDict(mc.initFrom), mc.initFrom);
    log::info("initialized from {}", mc.initFrom);
  }
  const c10::Device device = comm.device;
  model->to(device);
  const int64_t parameters = models::parameterCount(*model);
  log::info("model {}: {} parameters", mc.arch, parameters);

  ddp::DdpOptions dopts;
  dopts.bucketCapMb = job.distribution.bucketCapMb;
  dopts.findUnusedParameters = job.distribution.findUnusedParameters;
  dopts.broadcastBuffers = job.distribution.broadcastBuffers;
  ddp::DistributedDataParallel ddp(model, comm, dopts);
  ddp.broadcastState();
  log::info("gradient buckets: {} (cap {} MiB)", ddp.stats().buckets, dopts.bucketCapMb);
  // Dropout differs per rank, as each rank sees different samples.
  torch::manual_seed(static_cast<uint64_t>(tc.seed) * 1000003ull + static_cast<uint64_t>(rank) + 1);

  // Data pipeline.
  data::SamplerOptions so;
  so.size = trainSet->size();
  so.worldSize = world;
  so.rank = rank;
  so.shuffle = true;
  so.seed = static_cast<uint64_t>(tc.seed);
  so.evenSplit = true;
  data::DistributedSampler trainSampler(so);
  if (trainSampler.samplesPerRank() == 0) {
    throw DataError(fmt::format("{} training samples cannot be split over {} ranks",
                                trainSet->size(), world));
  }
  data::LoaderOptions lo;
  lo.batchSize = tc.batchSize;
  lo.threads = static_cast<int>(job.data.loaderThreads);
  lo.prefetch = static_cast<int>(job.data.prefetchBatches);
  lo.dropLast = job.data.dropLast;
  lo.seed = static_cast<uint64_t>(tc.seed);
  lo.transform = data::Transform::fromConfig(job.data.train, shape, true, "data.train");
  data::BatchLoader trainLoader(trainSet, lo);

  std::unique_ptr<data::BatchLoader> evalLoader;
  std::unique_ptr<data::DistributedSampler> evalSampler;
  if (evalSet) {
    data::SamplerOptions eo = so;
    eo.size = evalSet->size();
    eo.shuffle = false;
    eo.evenSplit = false;
    evalSampler = std::make_unique<data::DistributedSampler>(eo);
    data::LoaderOptions el = lo;
    el.batchSize = job.data.evalBatchSize > 0 ? job.data.evalBatchSize : 2 * tc.batchSize;
    el.dropLast = false;
    el.transform = data::Transform::fromConfig(job.data.eval, shape, false, "data.eval");
    evalLoader = std::make_unique<data::BatchLoader>(evalSet, el);
  }

  // Steps and learning rate.
  const int64_t perRank = trainSampler.samplesPerRank();
  const int64_t batchesPerEpoch =
      job.data.dropLast ? perRank / tc.batchSize : (perRank + tc.batchSize - 1) / tc.batchSize;
  if (batchesPerEpoch == 0) {
    throw DataError(fmt::format(
        "each rank gets {} training samples, fewer than one batch of {} (data.drop_last is set)",
        perRank, tc.batchSize));
  }
  const int64_t stepsPerEpoch = (batchesPerEpoch + tc.accumulateSteps - 1) / tc.accumulateSteps;
  int64_t totalSteps = stepsPerEpoch * tc.epochs;
  if (tc.maxSteps > 0) totalSteps = std::min(totalSteps, tc.maxSteps);
  const int64_t globalBatch = tc.batchSize * world * tc.accumulateSteps;
  const double peakLr = peakLearningRate(tc.optimizer, globalBatch);
  LrSchedule schedule(tc.schedule, peakLr, stepsPerEpoch, totalSteps);
  auto optimizer = createOptimizer(tc.optimizer, model->parameters());
  log::info("{} ranks x batch {} x {} micro-steps = global batch {}; peak lr {:.6g}; {} steps "
            "per epoch, {} in all",
            world, tc.batchSize, tc.accumulateSteps, globalBatch, peakLr, stepsPerEpoch,
            totalSteps);

  std::unique_ptr<monitor::MetricsWriter> metrics;
  std::unique_ptr<monitor::Progress> progress;
  if (rank == 0) {
    metrics = std::make_unique<monitor::MetricsWriter>(runDir.metrics());
    progress = std::make_unique<monitor::Progress>(
        monitor::progressMode(job.output.progress, log::consoleIsTerminal()), tc.epochs);
  }

  namespace F = torch::nn::functional;
  const auto lossOptions = F::CrossEntropyFuncOptions().label_smoothing(tc.labelSmoothing);

  TrainSummary summary;
  summary.parameters = parameters;
  summary.peakLr = peakLr;
  summary.globalBatch = globalBatch;
  const auto runStart = Clock::now();
  double trainSeconds = 0;
  double waitTotal = 0;
  int64_t step = 0;
  bool stop = false;

  for (int64_t epoch = 1; epoch <= tc.epochs && !stop; ++epoch) {
    model->train();
    trainLoader.startEpoch(trainSampler.indices(epoch - 1), epoch);
    if (progress) progress->startEpoch(epoch, std::min(stepsPerEpoch, totalSteps - step));
    const auto epochStart = Clock::now();
    const double epochWaitStart = trainLoader.waitSeconds();
    int64_t epochImages = 0;
    int64_t epochSteps = 0;
    double epochLossSum = 0;
    int64_t epochLossCount = 0;

    // Metrics window since the last train record.
    auto windowStart = Clock::now();
    double windowWaitStart = trainLoader.waitSeconds();
    double windowLoss = 0;
    int64_t windowMicro = 0, windowImages = 0;

    int64_t micro = 0;
    while (auto batch = trainLoader.next()) {
      const int64_t cycleStart = (micro / tc.accumulateSteps) * tc.accumulateSteps;
      const int64_t cycleLen = std::min(tc.accumulateSteps, batchesPerEpoch - cycleStart);
      const bool sync = micro - cycleStart == cycleLen - 1;
      // Samples in this optimizer step on this rank (the epoch's last batch
      // may be short); each micro-batch weighs by its share of them, so the
      // step's gradient is the mean over its samples. Every rank has the
      // same batch sizes, so the mean over ranks is the global mean.
      const int64_t cycleSamples =
          std::min(perRank, (cycleStart + cycleLen) * tc.batchSize) - cycleStart * tc.batchSize;
      if (micro == cycleStart) ddp.syncBuffers();
      ddp.setSyncGradients(sync);
      const int64_t n = batch->labels.size(0);
      at::Tensor logits = model->forward(batch->images.to(device, /*non_blocking=*/true));
      at::Tensor loss = F::cross_entropy(logits, batch->labels.to(device), lossOptions);
      const double lossValue = loss.item<double>();
      if (!std::isfinite(lossValue)) {
        throw Error(fmt::format("rank {}: the loss is {} at step {} (epoch {}): training diverged",
                                rank, lossValue, step + 1, epoch));
      }
      (loss * (static_cast<double>(n) / static_cast<double>(cycleSamples))).backward();
      windowLoss += lossValue;
      epochLossSum += lossValue;
      ++epochLossCount;
      ++windowMicro;
      windowImages += n;
      epochImages += n;
      ++micro;
      if (!sync) continue;

      ddp.finishGradients();
      const double lr = schedule.at(step);
      setLearningRate(*optimizer, lr);
      optimizer->step();
      ddp.zeroGrad();
      ++step;
      ++epochSteps;
      injectFault(fault, rank, step);

      const bool record = step % tc.logEvery == 0;
      if (record) {
        // One small allreduce at each record: loss and throughput of all ranks.
        const double elapsed = secondsSince(windowStart);
        at::Tensor w = torch::tensor({windowLoss, double(windowMicro),
                                      trainLoader.waitSeconds() - windowWaitStart, elapsed,
                                      double(windowImages)},
                                     torch::kFloat64);
        comm::allreduceSum(comm, w, "train metrics");
        auto a = w.accessor<double, 1>();
        monitor::TrainRecord r;
        r.step = step;
        r.epoch = epoch;
        r.loss = a[0] / std::max(1.0, a[1]);
        r.lr = lr;
        r.imagesPerS = a[3] > 0 ? a[4] / (a[3] / world) : 0;
        r.dataWaitFrac = a[3] > 0 ? a[2] / a[3] : 0;
        if (metrics) metrics->write(r);
        if (progress) progress->update(epochSteps, r.loss, r.imagesPerS, true);
        windowStart = Clock::now();
        windowWaitStart = trainLoader.waitSeconds();
        windowLoss = 0;
        windowMicro = 0;
        windowImages = 0;
      } else if (progress) {
        const double elapsed = secondsSince(epochStart);
        progress->update(epochSteps, epochLossSum / std::max<int64_t>(1, epochLossCount),
                         elapsed > 0 ? double(epochImages) * world / elapsed : NAN, false);
      }
      if (step >= totalSteps) {
        stop = true;
        break;
      }
    }

    const double epochSeconds = secondsSince(epochStart);
    trainSeconds += epochSeconds;
    waitTotal += trainLoader.waitSeconds() - epochWaitStart;
    summary.images += epochImages * world;
    summary.epochs = epoch;
    if (progress) progress->endEpoch();
    log::info("epoch {}/{}: {} steps in {:.1f} s, loss {:.4f}, {:.0f} img/s", epoch, tc.epochs,
              epochSteps, epochSeconds, epochLossSum / std::max<int64_t>(1, epochLossCount),
              epochSeconds > 0 ? double(epochImages) * world / epochSeconds : 0.0);

    const bool last = epoch == tc.epochs || stop;
    const bool due = tc.evalEvery > 0 ? (epoch % tc.evalEvery == 0) : false;
    if (evalLoader && (due || last)) {
      ddp.syncBuffers();
      const auto evalStart = Clock::now();
      EvalResult e = evaluate(*model, *evalLoader, *evalSampler, comm, job.model.numClasses);
      monitor::EvalRecord r;
      r.step = step;
      r.epoch = epoch;
      r.top1 = e.top1;
      r.top5 = e.top5;
      r.loss = e.loss;
      r.samples = e.samples;
      r.seconds = secondsSince(evalStart);
      if (metrics) metrics->write(r);
      summary.evaluated = true;
      summary.lastEval = r;
      summary.bestTop1 = std::max(summary.bestTop1, r.top1);
      log::info("eval after epoch {}: top-1 {:.4f}, top-5 {:.4f}, loss {:.4f} ({} images, {:.1f} s)",
                epoch, r.top1, r.top5, r.loss, r.samples, r.seconds);
      model->train();
    }
  }

  summary.steps = step;
  summary.seconds = secondsSince(runStart);
  const ddp::DdpStats ds = ddp.stats();
  log::info("gradient exchanges: {}; bucket allreduces started during backward: {}, after it: {}",
            ds.syncs, ds.launchedDuringBackward, ds.launchedAtFinish);
  summary.imagesPerS = trainSeconds > 0 ? double(summary.images) / trainSeconds : 0;
  at::Tensor waits = torch::tensor({trainSeconds > 0 ? waitTotal / trainSeconds : 0.0}, torch::kFloat64);
  comm::allreduceSum(comm, waits, "data wait summary");
  summary.dataWaitFrac = waits.item<double>() / world;

  ddp.syncBuffers();  // the saved BatchNorm statistics are rank 0's, as during training
  if (rank == 0 && job.output.saveFinal) {
    ckpt::saveStateDict(ckpt::stateDict(*model), runDir.finalModel());
    log::info("saved {}", runDir.finalModel());
  }
  return summary;
}

void writeSummary(const JobConfig& job, const TrainSummary& s, const RunDir& runDir,
                  int worldSize) {
  nlohmann::json j;
  j["job"] = job.name;
  j["status"] = "completed";
  j["world_size"] = worldSize;
  j["epochs"] = s.epochs;
  j["steps"] = s.steps;
  j["global_batch"] = s.globalBatch;
  j["peak_lr"] = s.peakLr;
  j["parameters"] = s.parameters;
  j["wall_time_s"] = s.seconds;
  j["train_images"] = s.images;
  j["train_images_per_s"] = s.imagesPerS;
  j["data_wait_frac"] = s.dataWaitFrac;
  if (s.evaluated) {
    j["eval"] = {{"epoch", s.lastEval.epoch}, {"top1", s.lastEval.top1},
                 {"top5", s.lastEval.top5},   {"loss", s.lastEval.loss},
                 {"samples", s.lastEval.samples}};
    j["best_top1"] = s.bestTop1;
  }
  j["run_dir"] = runDir.root;
  j["outputs"] = {{"job", runDir.jobFile()}, {"metrics", runDir.metrics()},
                  {"logs", runDir.logsDir()}};
  if (job.output.saveFinal) j["outputs"]["model"] = runDir.finalModel();
  writeFileAtomic(runDir.summary(), j.dump(2) + "\n");
}

}  // namespace cohort::train
