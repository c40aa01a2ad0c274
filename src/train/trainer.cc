#include "cohort/train/trainer.h"

#include <fmt/format.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <ATen/core/Generator.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cohort/ckpt/checkpointer.h"
#include "cohort/ckpt/resume.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/config/load.h"
#include "cohort/core/checksum.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/data/loader.h"
#include "cohort/data/sampler.h"
#include "cohort/security/keys.h"
#include "cohort/storage/storage.h"
#include "cohort/ddp/ddp.h"
#include "cohort/models/model.h"
#include "cohort/monitor/activity.h"
#include "cohort/monitor/health.h"
#include "cohort/monitor/progress.h"
#include "cohort/monitor/straggler.h"
#include "cohort/monitor/tensorboard.h"
#include "cohort/monitor/timeline.h"
#include "cohort/train/lr_schedule.h"
#include "cohort/train/optimizer.h"
#include "cohort/train/stop.h"

namespace cohort::train {
namespace {

// training.on_nonfinite: skip gives up after this many skipped steps in a row.
constexpr int64_t kMaxNonfiniteInARow = 10;

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

double secondsSince(Clock::time_point t) { return seconds(t, Clock::now()); }

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
  using A = env::Fault::Action;
  if (fault->action == A::slow || fault->action == A::nan) return;  // in the step itself
  if (fault->action == A::sleep) {
    log::warn("COHORT_FAULT: hanging for {} s after step {}", fault->amount, step);
    std::this_thread::sleep_for(std::chrono::seconds(fault->amount));
    return;
  }
  if (fault->action == A::kill) {
    log::warn("COHORT_FAULT: killing this rank with SIGKILL after step {}", step);
    log::flush();
    ::kill(::getpid(), SIGKILL);
  }
  log::warn("COHORT_FAULT: exiting with code {} after step {}", fault->exitCode, step);
  log::flush();
  std::_Exit(fault->exitCode);
}

// The random state, as a function the checkpoint's copier thread calls:
// cloning the generator is cheap, building its state tensor is not (~0.1 ms).
std::function<at::Tensor()> rngStateLater() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return [clone = gen.clone()]() { return clone.get_state(); };
}

void setRngState(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Keys whose change makes a checkpoint's position in the epoch meaningless.
bool positionDependsOn(const std::string& key) {
  return key.rfind("data.train.", 0) == 0 || key == "training.batch_size" ||
         key == "training.accumulate_steps" || key == "training.seed" ||
         key == "data.drop_last" || key == "training.optimizer.name";
}

// Refuses a checkpoint this run cannot continue exactly; warns about job
// changes that are safe (more epochs, another learning rate, ...).
void checkResumable(const ckpt::Manifest& m, const JobConfig& job, const comm::Comm& comm,
                    const std::string& path) {
  if (m.worldSize != comm.worldSize) {
    throw ConfigError(fmt::format(
        "cannot resume from {}: it was written by {} ranks and this run has {}. Each rank's "
        "place in the epoch and its random state belong to a world size; resume with {} ranks "
        "(cohort run --procs {}), or start a new run with model.init_from={}/model.bin's weights "
        "exported by `cohort ckpt export`",
        path, m.worldSize, comm.worldSize, m.worldSize, m.worldSize, path));
  }
  if (m.jobHash == jobHash(job)) return;
  const std::string saved = m.extra.value("job", std::string());
  std::vector<std::string> changed;
  for (const auto& c : diffJobs(saved, job)) {
    if (positionDependsOn(c.key)) {
      throw ConfigError(fmt::format(
          "cannot resume from {}: {} changed from {} to {}, and the checkpoint's place in the "
          "epoch depends on it; start a new run (cohort run --new-run) instead",
          path, c.key, c.before, c.after));
    }
    changed.push_back(fmt::format("{}: {} -> {}", c.key, c.before, c.after));
  }
  if (comm.rank == 0 && !changed.empty()) {
    log::warn("resuming with a changed job: {}", fmt::join(changed, "; "));
  }
}

}  // namespace

std::string checkpointDir(const JobConfig& job, const RunDir& runDir) {
  if (job.checkpoint.dir.empty()) return runDir.root + "/checkpoints";
  return job.checkpoint.dir + "/" + std::filesystem::path(runDir.root).filename().string();
}

std::string remoteCheckpointDir(const JobConfig& job, const RunDir& runDir) {
  if (job.checkpoint.remote.empty()) return "";
  return storage::joinUrl(job.checkpoint.remote, std::filesystem::path(runDir.root).filename().string());
}

std::string chooseResumeCheckpoint(const JobConfig& job, const RunDir& runDir,
                                   const std::string& resumeArg) {
  namespace fs = std::filesystem;
  const std::string own = checkpointDir(job, runDir);
  std::vector<std::string> skipped;
  std::optional<ckpt::ResumePoint> point = ckpt::newestValidCheckpoint(own, &skipped);
  for (const auto& s : skipped) log::warn("skipping invalid checkpoint {}", s);
  if (!point && !resumeArg.empty()) point = ckpt::resolveResumePath(resumeArg);
  if (!point && !job.checkpoint.remote.empty()) {
    auto tier =
        ckpt::openTier(remoteCheckpointDir(job, runDir), storage::storageOptions(job.storage));
    const auto steps = tier->list();
    if (!steps.empty()) {
      const std::string local = own + "/" + ckpt::checkpointDirName(steps.back());
      log::info("downloading checkpoint step {} from {}", steps.back(), tier->describe());
      tier->download(steps.back(), local);
      ckpt::Verification v = ckpt::verifyCheckpoint(local, true);
      if (!v.valid) throw DataError(fmt::format("downloaded checkpoint is invalid: {}", v.problem));
      point = ckpt::ResumePoint{local, steps.back(), {}};
    }
  }
  // What the run's own directory holds past the chosen point is written
  // afresh by the resumed run: directories never committed are removed,
  // invalid ones are set aside (step-<N>.invalid-<time>) for inspection.
  const int64_t keepUpTo = point ? point->step : -1;
  for (const auto& d : ckpt::listCheckpointDirs(own)) {
    if (d.step <= keepUpTo) continue;
    std::error_code ec;
    if (!fs::exists(d.path + "/manifest.json", ec)) {
      fs::remove_all(d.path, ec);
      log::info("removed {} (never committed)", d.path);
      continue;
    }
    const std::string aside = d.path + ".invalid-" + ckpt::utcNow();
    fs::rename(d.path, aside, ec);
    log::warn("set aside the invalid checkpoint {} as {}", d.path, aside);
  }
  return point ? point->path : std::string();
}

TrainSummary train(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir,
                   const TrainOptions& options) {
  const TrainingConfig& tc = job.training;
  const CheckpointConfig& cc = job.checkpoint;
  const int rank = comm.rank;
  const int world = comm.worldSize;
  std::optional<env::Fault> fault = env::fault();
  if (fault && !fault->everyAttempt && options.restartCount > 0) fault.reset();
  // distribution.preflight: refuse to start on unfit hardware, before the
  // loader threads and the model compete with the measurements.
  if (job.distribution.preflight) {
    monitor::setPhase(monitor::Phase::starting);
    monitor::preflight(comm, job.health, runDir.root);
  }
  const bool skipNonfinite = tc.onNonfinite == "skip";
  int64_t nonfiniteInARow = 0;
  bool cycleLossNonfinite = false;  // a loss of this optimizer step was NaN or Inf here
  std::vector<at::Tensor> savedBuffers;  // on_nonfinite: skip: the step's starting buffers

  // Data. Every rank opens the datasets itself (they are read-only).
  data::OpenOptions openOptions;
  openOptions.storage = storage::storageOptions(job.storage);
  openOptions.cache = job.data.cache;
  openOptions.training = true;
  auto trainSet = data::openDataset(job.data.train, job.model.numClasses, openOptions);
  std::shared_ptr<data::Dataset> evalSet;
  openOptions.training = false;
  if (job.data.eval.kind != "none") {
    evalSet = data::openDataset(job.data.eval, job.model.numClasses, openOptions);
  }
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
  {
    // Same job file, different code or data could still build different
    // models; the ranks would then exchange mismatched gradients.
    Hasher h;
    int64_t tensors = 0, values = 0;
    for (const auto& [name, t] : ckpt::stateDict(*model)) {
      h.update(name.data(), name.size());
      h.update(t.sizes().data(), t.sizes().size() * sizeof(int64_t));
      ++tensors;
      values += t.numel();
    }
    comm::checkAgreement(comm, "model (names and shapes of its tensors)",
                         fmt::format("{} tensors, {} values, digest {}", tensors, values, h.hex()));
  }
  std::optional<ckpt::Manifest> resume;
  if (!options.resumeFrom.empty()) {
    resume = ckpt::readManifest(options.resumeFrom);
    checkResumable(*resume, job, comm, options.resumeFrom);
    // Before metrics.jsonl is opened for appending: it is rewritten.
    if (rank == 0) monitor::dropRecordsAfter(runDir.metrics(), resume->step);
    const std::string file = options.resumeFrom + "/model.bin";
    ckpt::loadStateDict(*model, ckpt::readTensorFile(file).tensors, file);
  } else if (rank == 0) {
    // A fresh start in a run directory an earlier attempt wrote to (a
    // restart before the first checkpoint): its records are repeated too.
    monitor::dropRecordsAfter(runDir.metrics(), 0);
  }
  if (!resume && !mc.initFrom.empty()) {
    ckpt::loadStateDict(*model, ckpt::readStateDict(mc.initFrom), mc.initFrom);
    log::info("initialized from {}", mc.initFrom);
  }
  const c10::Device device = comm.device;
  model->to(device);
  // Before the buckets: their gradient views take the weights' strides.
  const auto layout = chooseMemoryFormat(*model, mc, tc.batchSize, shape.channels, shape.height,
                                         shape.width, comm);
  ComputeState compute = observeCompute();
  compute.memoryFormat = layout.format;
  compute.memoryFormatReason = layout.reason;
  log::info("{}", describe(compute));
  const int64_t parameters = models::parameterCount(*model);
  log::info("model {}: {} parameters", mc.arch, parameters);

  ddp::DdpOptions dopts;
  dopts.bucketCapMb = job.distribution.bucketCapMb;
  dopts.findUnusedParameters = job.distribution.findUnusedParameters;
  dopts.broadcastBuffers = job.distribution.broadcastBuffers;
  dopts.divideGradients = false;  // the loss carries 1 / world instead (see below)
  dopts.sharedMemory = job.distribution.sharedMemory;
  dopts.compression = job.distribution.compression == "fp16"   ? ddp::DdpOptions::Compression::fp16
                      : job.distribution.compression == "bf16" ? ddp::DdpOptions::Compression::bf16
                                                               : ddp::DdpOptions::Compression::none;
  ddp::DistributedDataParallel ddp(model, comm, dopts);
  ddp.broadcastState();
  log::info("gradient buckets: {} (cap {} MiB)", ddp.stats().buckets, dopts.bucketCapMb);
  // Dropout differs per rank, as each rank sees different samples.
  torch::manual_seed(static_cast<uint64_t>(tc.seed) * 1000003ull + static_cast<uint64_t>(rank) + 1);
  if (resume) {
    const std::string file = fmt::format("{}/rank-{}.bin", options.resumeFrom, rank);
    const auto own = ckpt::stateDict(*model);
    torch::NoGradGuard noGrad;
    for (const auto& [name, t] : ckpt::readTensorFile(file).tensors) {
      if (name == "rng.cpu") setRngState(t);
      if (name.rfind("buffer.", 0) != 0) continue;
      // This rank's own buffers (broadcast_buffers: false).
      for (const auto& [n, live] : own) {
        if (n == name.substr(7) && live.sizes() == t.sizes()) live.copy_(t);
      }
    }
  }

  // Data pipeline.
  data::SamplerOptions so;
  so.size = trainSet->size();
  so.worldSize = world;
  so.rank = rank;
  so.shuffle = true;
  so.seed = static_cast<uint64_t>(tc.seed);
  so.evenSplit = true;
  so.order = [trainSet, seed = so.seed](int64_t epoch) { return trainSet->shuffledOrder(seed, epoch); };
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
    eo.order = nullptr;
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
  std::vector<std::string> paramNames;
  for (const auto& p : model->named_parameters()) paramNames.push_back(p.key());
  if (resume) {
    const std::string file = options.resumeFrom + "/optimizer.bin";
    loadOptimizerState(*optimizer, paramNames, ckpt::readTensorFile(file).tensors, file);
  }
  log::info("{} ranks x batch {} x {} micro-steps = global batch {}; peak lr {:.6g}; {} steps "
            "per epoch, {} in all",
            world, tc.batchSize, tc.accumulateSteps, globalBatch, peakLr, stepsPerEpoch,
            totalSteps);

  std::unique_ptr<monitor::MetricsWriter> metrics;
  std::unique_ptr<monitor::Progress> progress;
  std::unique_ptr<monitor::TensorBoardWriter> board;
  if (rank == 0) {
    metrics = std::make_unique<monitor::MetricsWriter>(runDir.metrics());
    if (job.output.tensorboard) {
      try {
        board = std::make_unique<monitor::TensorBoardWriter>(runDir.root + "/tensorboard");
      } catch (const std::exception& e) {
        log::warn("no TensorBoard output: {}", e.what());
      }
    }
    progress = std::make_unique<monitor::Progress>(
        monitor::progressMode(job.output.progress, log::consoleIsTerminal()), tc.epochs);
  }

  // TensorBoard is an optional output: a failure to write it (a full disk)
  // stops it, with a warning, not the training.
  auto toBoard = [&](int64_t at, std::initializer_list<std::pair<const char*, double>> scalars) {
    if (!board) return;
    try {
      for (const auto& [tag, v] : scalars) board->addScalar(tag, at, v);
      board->flush();
    } catch (const std::exception& e) {
      log::warn("TensorBoard output stopped: {}", e.what());
      board.reset();
    }
  };
  namespace F = torch::nn::functional;
  const auto lossOptions = F::CrossEntropyFuncOptions().label_smoothing(tc.labelSmoothing);

  TrainSummary summary;
  summary.compute = compute;
  summary.parameters = parameters;
  summary.peakLr = peakLr;
  summary.globalBatch = globalBatch;
  summary.restartCount = options.restartCount;
  const auto runStart = Clock::now();
  double trainSeconds = 0;
  double waitTotal = 0;
  int64_t step = 0;
  int64_t firstEpoch = 1;
  int64_t firstBatch = 0;
  bool stop = false;
  if (resume) {
    step = resume->step;
    monitor::setStep(step);
    firstEpoch = resume->epoch;
    firstBatch = resume->batchInEpoch;
    summary.resumedFromStep = step;
    summary.resumedFrom = options.resumeFrom;
    if (firstBatch > batchesPerEpoch) {
      throw ConfigError(fmt::format("cannot resume from {}: it is at batch {} of epoch {}, which "
                                    "has {} batches in this job",
                                    options.resumeFrom, firstBatch, firstEpoch, batchesPerEpoch));
    }
    log::info("resumed from {}: step {}, epoch {}, batch {} of {} (sample {} of the epoch)",
              options.resumeFrom, step, firstEpoch, firstBatch, batchesPerEpoch,
              resume->samplesInEpoch);
    if (metrics) {
      metrics->writeLine(nlohmann::json{{"event", "resume"},
                                        {"step", step},
                                        {"from", options.resumeFrom},
                                        {"restart_count", options.restartCount}}
                             .dump());
    }
  }

  // Checkpoints: what each one holds. Parameters, buffers and optimizer
  // state are the same on every rank (rank 0 writes them); each rank writes
  // its random state.
  std::unique_ptr<ckpt::Checkpointer> checkpointer;
  std::vector<ckpt::SnapshotItem> modelItems;
  std::shared_ptr<const std::vector<ckpt::SnapshotItem>> modelList, optimizerList;
  uint64_t optimizerGeneration = 0;
  if (cc.enabled) {
    ckpt::CheckpointerOptions co;
    co.dir = checkpointDir(job, runDir);
    co.rank = rank;
    co.worldSize = world;
    co.maxInFlight = static_cast<int>(cc.maxInFlight);
    co.whenBehind = cc.whenBehind == "wait" ? ckpt::WhenBehind::wait : ckpt::WhenBehind::skip;
    co.onError = cc.onError == "fail" ? ckpt::OnError::fail : ckpt::OnError::warn;
    co.keepLast = cc.keepLast;
    co.keepEvery = cc.keepEverySteps;
    co.timeout = comm.timeout;
    if (world > 1) co.store = comm::openStoreClient(comm);
    if (rank == 0 && !cc.remote.empty()) {
      co.remote =
          ckpt::openTier(remoteCheckpointDir(job, runDir), storage::storageOptions(job.storage));
    }
    if (auto p = env::checkpointPauseStep()) co.pauseAtStep = *p;
    co.manifestExtra = {{"job", toYaml(job)}};
    if (const security::Keyring* keys = security::installedKeyring()) {
      co.sealWith = keys->current;
      co.manifestExtra["encryption"] = {{"algorithm", "AES-256-GCM"}, {"key_id", keys->current.id}};
    }
    checkpointer = std::make_unique<ckpt::Checkpointer>(co);
    if (rank == 0) {
      // Model, and optimizer state of about one (sgd) or two (adamw) copies
      // of the parameters, plus room for headers and alignment.
      uint64_t bytes = 0, params = 0;
      for (const auto& [n, t] : ckpt::stateDict(*model)) bytes += t.nbytes();
      for (const auto& p : model->parameters()) params += p.nbytes();
      bytes += params * (tc.optimizer.name == "adamw" ? 2 : 1) + (uint64_t{8} << 20);
      checkpointer->reserve(bytes);
    }
    std::set<const void*> buffers;
    for (const auto& b : model->buffers()) buffers.insert(b.unsafeGetTensorImpl());
    for (auto& [name, t] : ckpt::stateDict(*model)) {
      modelItems.push_back({name, t, buffers.count(t.unsafeGetTensorImpl()) > 0});
    }
    modelList = std::make_shared<const std::vector<ckpt::SnapshotItem>>(modelItems);
  }
  const std::string optimizerName = tc.optimizer.name;
  OptimizerStateCache optimizerCache(*optimizer, paramNames);
  const std::string hash = jobHash(job);
  auto takeCheckpoint = [&](int64_t epoch, int64_t micro, double lr) {
    const auto since = Clock::now();
    monitor::setPhase(monitor::Phase::checkpoint);
    monitor::TimelineSpan span("checkpoint (training blocked)", "checkpoint");
    ckpt::Manifest m;
    m.step = step;
    m.epoch = epoch;
    m.batchInEpoch = micro;
    m.samplesInEpoch = std::min(perRank, micro * tc.batchSize) * world;
    m.worldSize = world;
    m.jobHash = hash;
    m.extra = {{"lr", lr}, {"optimizer", optimizerName}, {"peak_lr", peakLr},
               {"global_batch", globalBatch}};
    std::vector<ckpt::SnapshotFile> files;
    if (rank == 0) {
      // The lists of live tensors are built once (again only when the
      // optimizer's set of states changes): marking costs no copy of them.
      files.emplace_back("model.bin", modelList, nlohmann::json{{"kind", "model"}, {"arch", mc.arch}});
      const auto& state = optimizerCache.get();
      if (!optimizerList || optimizerCache.generation() != optimizerGeneration) {
        std::vector<ckpt::SnapshotItem> items;
        for (const auto& [name, t] : state) items.push_back({name, t, false});
        optimizerList = std::make_shared<const std::vector<ckpt::SnapshotItem>>(std::move(items));
        optimizerGeneration = optimizerCache.generation();
      }
      files.emplace_back("optimizer.bin", optimizerList,
                         nlohmann::json{{"kind", "optimizer"}, {"name", optimizerName}});
    }
    std::vector<ckpt::SnapshotItem> own{{"rng.cpu", rngStateLater()}};
    if (!job.distribution.broadcastBuffers) {
      // Buffers differ per rank when they are not broadcast.
      for (const auto& item : modelItems) {
        if (item.early) own.push_back({"buffer." + item.name, item.tensor, true});
      }
    }
    files.emplace_back(fmt::format("rank-{}.bin", rank), std::move(own),
                       nlohmann::json{{"kind", "rank"}, {"rank", rank}});
    const bool taken = checkpointer->mark(std::move(m), std::move(files), since);
    toBoard(step, {{"checkpoint/blocked_ms", 1000 * secondsSince(since)}});
    return taken;
  };

  // A stop request (SIGTERM) ends training at a step boundary every rank
  // agrees on: the first rank to see one publishes "stop after step s+1"; no
  // rank can finish step s+1 before that, as its gradients need every rank.
  StopRequest& stopReq = stopRequest();
  stopReq.graceful = cc.enabled;
  std::optional<int64_t> stopAt;
  bool stopPublished = false;
  auto stopDue = [&]() -> bool {
    if (!cc.enabled) return false;
    if (!stopPublished && stopReq.signal.load() != 0) {
      stopPublished = true;
      if (world == 1) {
        stopAt = step;
      } else if (comm.store->add("stop/count", 1) == 1) {
        const std::string v = std::to_string(step + 1);
        comm.store->set("stop/at", std::vector<uint8_t>(v.begin(), v.end()));
        // set() expects no reply: a round trip on the same connection makes
        // sure the store holds the key before this rank's next step starts.
        comm.store->get("stop/at");
      }
    }
    if (!stopAt && world > 1 && comm.store->check({"stop/at"})) {
      const auto v = comm.store->get("stop/at");
      stopAt = std::stoll(std::string(v.begin(), v.end()));
    }
    return stopAt && step >= *stopAt;
  };

  for (int64_t epoch = firstEpoch; epoch <= tc.epochs && !stop; ++epoch) {
    model->train();
    // A run resumed at its last step trains no more, but still evaluates.
    const int64_t startBatch =
        step >= totalSteps ? batchesPerEpoch : (epoch == firstEpoch ? firstBatch : 0);
    if (step >= totalSteps) stop = true;
    trainLoader.startEpoch(trainSampler.indices(epoch - 1), epoch, startBatch);
    if (progress) {
      progress->startEpoch(epoch, std::min(stepsPerEpoch - startBatch / tc.accumulateSteps,
                                           totalSteps - step));
    }
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
    int64_t windowMicro = 0, windowImages = 0, windowSkipped = 0, windowSteps = 0;

    int64_t micro = startBatch;
    double windowComputeStart = summary.phases.forward + summary.phases.backward;
    for (;;) {
      monitor::setPhase(monitor::Phase::data);
      auto batch = [&] {
        monitor::TimelineSpan span("data wait", "data");
        return trainLoader.next();
      }();
      if (!batch) break;
      const int64_t cycleStart = (micro / tc.accumulateSteps) * tc.accumulateSteps;
      const int64_t cycleLen = std::min(tc.accumulateSteps, batchesPerEpoch - cycleStart);
      const bool sync = micro - cycleStart == cycleLen - 1;
      // Samples in this optimizer step on this rank (the epoch's last batch
      // may be short); each micro-batch weighs by its share of them, so the
      // step's gradient is the mean over its samples. Every rank has the
      // same batch sizes, so the mean over ranks is the global mean.
      const int64_t cycleSamples =
          std::min(perRank, (cycleStart + cycleLen) * tc.batchSize) - cycleStart * tc.batchSize;
      PhaseTimes& ph = summary.phases;
      if (micro == cycleStart) cycleLossNonfinite = false;
      if (skipNonfinite && micro == cycleStart) {
        // A skipped step must not keep what its forward passes did to the
        // BatchNorm statistics either.
        torch::NoGradGuard noGrad;
        savedBuffers.clear();
        for (const auto& b : model->buffers()) savedBuffers.push_back(b.clone());
      }
      // Buffers (BatchNorm statistics) are not sent every step: in training
      // mode no layer reads them, rank 0's are the ones checkpointed, and
      // every rank takes rank 0's before evaluation and the final save. The
      // outputs are those of a broadcast before each step, at no cost.
      ddp.setSyncGradients(sync);
      auto t1 = Clock::now();
      monitor::setPhase(monitor::Phase::forward);
      const int64_t n = batch->labels.size(0);
      at::Tensor loss;
      {
        monitor::TimelineSpan span("forward", "compute");
        at::Tensor images = batch->images.to(device, /*non_blocking=*/true);
        if (fault && fault->rank == rank && fault->action == env::Fault::Action::nan &&
            step == fault->step) {
          images = images * std::numeric_limits<float>::quiet_NaN();
        }
        at::Tensor logits = model->forward(images);
        loss = F::cross_entropy(logits, batch->labels.to(device), lossOptions);
        if (fault && fault->rank == rank && fault->action == env::Fault::Action::slow &&
            step >= fault->step) {
          std::this_thread::sleep_for(std::chrono::milliseconds(fault->amount));
        }
      }
      const double lossValue = loss.item<double>();
      auto t2 = Clock::now();
      ph.forward += seconds(t1, t2);
      if (!std::isfinite(lossValue)) {
        // Every gradient becomes NaN, so after the exchange every rank sees
        // it and all decide together (a rank stopping alone would leave the
        // others waiting in the exchange).
        loss = loss * std::numeric_limits<double>::quiet_NaN();
        cycleLossNonfinite = true;
      }
      monitor::setPhase(monitor::Phase::backward);
      // Scaled by 1 / world too: the exchange sums, so .grad ends as the
      // mean over ranks without a division pass over every gradient.
      const double shmBefore = ddp.stats().sharedMemorySeconds;
      {
        monitor::TimelineSpan span("backward", "compute");
        (loss * (static_cast<double>(n) / (static_cast<double>(cycleSamples) * world))).backward();
      }
      // A shared-memory exchange runs inside backward: count it as exposed
      // communication, not as backward.
      const double shmSeconds = ddp.stats().sharedMemorySeconds - shmBefore;
      ph.backward += secondsSince(t2) - shmSeconds;
      ph.exposedComm += shmSeconds;
      if (std::isfinite(lossValue)) {
        windowLoss += lossValue;
        epochLossSum += lossValue;
        ++epochLossCount;
        ++windowMicro;
      }
      windowImages += n;
      windowSkipped += batch->skipped;
      summary.corruptSkipped += batch->skipped;
      epochImages += n;
      ++micro;
      if (!sync) continue;

      auto t3 = Clock::now();
      monitor::setPhase(monitor::Phase::exchange);
      {
        monitor::TimelineSpan span("gradient exchange (wait)", "comm");
        ddp.finishGradients();
      }
      auto t4 = Clock::now();
      ph.exposedComm += seconds(t3, t4);
      monitor::setPhase(monitor::Phase::optimizer);
      const double lr = schedule.at(step);
      {
        monitor::TimelineSpan span("optimizer", "compute");
        // The gradients are the same on every rank after the exchange, so
        // every rank reaches the same verdict without a message.
        if (ddp.gradientsFinite()) {
          nonfiniteInARow = 0;
          if (checkpointer) checkpointer->waitCopied();  // the step modifies what is being copied
          setLearningRate(*optimizer, lr);
          optimizer->step();
        } else {
          ++summary.nonfiniteSkipped;
          ++nonfiniteInARow;
          const std::string what =
              cycleLossNonfinite
                  ? fmt::format("the loss is {} on this rank", lossValue)
                  : std::string("a gradient is NaN or Inf (from another rank's loss, or an "
                                "overflow in backward)");
          if (!skipNonfinite || nonfiniteInARow >= kMaxNonfiniteInARow) {
            // Every rank is here at the same step: the checkpoints still
            // being written (the last good state) are committed first.
            if (checkpointer) checkpointer->flush();
            throw DivergedError(fmt::format(
                "rank {}: {} at step {} (epoch {}){}: training diverged; the weights were not "
                "updated, the last checkpoint holds the last good state{}",
                rank, what, step + 1, epoch,
                skipNonfinite ? fmt::format(", {} steps in a row", nonfiniteInARow) : "",
                skipNonfinite ? "" : " (training.on_nonfinite: skip drops such steps instead)"));
          }
          {
            torch::NoGradGuard noGrad;
            auto live = model->buffers();
            for (size_t k = 0; k < live.size() && k < savedBuffers.size(); ++k) {
              live[k].copy_(savedBuffers[k]);
            }
          }
          log::warn("step {}: non-finite gradient ({}): update skipped (training.on_nonfinite: "
                    "skip), {} in a row",
                    step + 1, what, nonfiniteInARow);
          if (metrics) {
            metrics->writeLine(nlohmann::json{{"event", "nonfinite_skipped"},
                                              {"step", step + 1},
                                              {"in_a_row", nonfiniteInARow}}
                                   .dump());
          }
        }
        ddp.zeroGrad();
      }
      ph.optimizer += secondsSince(t4);
      ++ph.steps;
      ++step;
      ++epochSteps;
      ++windowSteps;
      monitor::setStep(step);
      injectFault(fault, rank, step);

      const bool record = step % tc.logEvery == 0;
      if (record) {
        // One small allreduce at each record: loss and throughput of all
        // ranks, and each rank's compute time in its own slot (stragglers).
        const double elapsed = secondsSince(windowStart);
        const double compute = ph.forward + ph.backward - windowComputeStart;
        windowComputeStart = ph.forward + ph.backward;
        constexpr int kSlots = 7;
        at::Tensor w = torch::zeros({kSlots + world}, torch::kFloat64);
        {
          auto a = w.accessor<double, 1>();
          const double values[kSlots] = {windowLoss, double(windowMicro),
                                         trainLoader.waitSeconds() - windowWaitStart, elapsed,
                                         double(windowImages), double(windowSkipped),
                                         double(windowSteps)};
          for (int k = 0; k < kSlots; ++k) a[k] = values[k];
          a[kSlots + rank] = compute;
        }
        comm::allreduceSum(comm, w, "train metrics");
        auto a = w.accessor<double, 1>();
        if (rank == 0 && job.distribution.stragglerFactor > 0 && a[6] > 0) {
          std::vector<double> msPerStep;
          for (int r = 0; r < world; ++r) msPerStep.push_back(1000 * a[kSlots + r] / (a[6] / world));
          for (const auto& s : monitor::findStragglers(msPerStep, job.distribution.stragglerFactor)) {
            log::warn("straggler at step {}: {} (distribution.straggler_factor {})", step,
                      monitor::describe(s), job.distribution.stragglerFactor);
            if (metrics) {
              metrics->writeLine(nlohmann::json{{"event", "straggler"},
                                                {"step", step},
                                                {"rank", s.rank},
                                                {"compute_ms_per_step", s.ms},
                                                {"median_ms_per_step", s.medianMs}}
                                     .dump());
            }
          }
        }
        monitor::TrainRecord r;
        r.step = step;
        r.epoch = epoch;
        r.loss = a[0] / std::max(1.0, a[1]);
        r.lr = lr;
        r.imagesPerS = a[3] > 0 ? a[4] / (a[3] / world) : 0;
        r.dataWaitFrac = a[3] > 0 ? a[2] / a[3] : 0;
        r.corruptSkipped = static_cast<int64_t>(a[5]);
        if (metrics) metrics->write(r);
        toBoard(step, {{"train/loss", r.loss},
                       {"train/lr", r.lr},
                       {"train/images_per_s", r.imagesPerS},
                       {"train/data_wait_frac", r.dataWaitFrac}});
        if (progress) progress->update(epochSteps, r.loss, r.imagesPerS, true);
        windowSteps = 0;
        windowStart = Clock::now();
        windowWaitStart = trainLoader.waitSeconds();
        windowLoss = 0;
        windowMicro = 0;
        windowImages = 0;
        windowSkipped = 0;
      } else if (progress) {
        const double elapsed = secondsSince(epochStart);
        progress->update(epochSteps, epochLossSum / std::max<int64_t>(1, epochLossCount),
                         elapsed > 0 ? double(epochImages) * world / elapsed : NAN, false);
      }
      if (checkpointer) {
        checkpointer->poll();
        const bool endOfEpoch = micro == batchesPerEpoch;
        const bool due = (cc.everySteps > 0 && step % cc.everySteps == 0) ||
                         (endOfEpoch && cc.everyEpochs > 0 && epoch % cc.everyEpochs == 0);
        if (stopDue()) {
          // The last checkpoint is never skipped: a buffer is free once the
          // earlier ones are written. It is durable when flush returns.
          checkpointer->flush();
          takeCheckpoint(epoch, micro, lr);
          checkpointer->flush();
          if (checkpointer->lastWrittenStep() != step) {
            throw IoError(fmt::format(
                "rank {}: stopping on request, but the checkpoint of step {} could not be "
                "written (see the warning above); a rerun resumes from the previous one",
                rank, step));
          }
          summary.stopped = true;
          log::warn("stopped on request after step {} (epoch {}, batch {}); checkpoint written: "
                    "rerun the same command to resume",
                    step, epoch, micro);
        } else if (due) {
          takeCheckpoint(epoch, micro, lr);
        }
      }
      if (summary.stopped || step >= totalSteps) {
        stop = true;
        break;
      }
    }

    const double epochSeconds = secondsSince(epochStart);
    trainSeconds += epochSeconds;
    waitTotal += trainLoader.waitSeconds() - epochWaitStart;
    summary.phases.dataWait += trainLoader.waitSeconds() - epochWaitStart;
    summary.images += epochImages * world;
    summary.epochs = epoch;
    if (progress) progress->endEpoch();
    log::info("epoch {}/{}: {} steps in {:.1f} s, loss {:.4f}, {:.0f} img/s", epoch, tc.epochs,
              epochSteps, epochSeconds, epochLossSum / std::max<int64_t>(1, epochLossCount),
              epochSeconds > 0 ? double(epochImages) * world / epochSeconds : 0.0);
    if (const std::string io = trainSet->ioSummary(); !io.empty()) {
      log::info("training data after epoch {}: {}", epoch, io);
    }

    const bool last = epoch == tc.epochs || stop;
    const bool due = tc.evalEvery > 0 ? (epoch % tc.evalEvery == 0) : false;
    if (evalLoader && (due || last) && !summary.stopped) {
      monitor::setPhase(monitor::Phase::evaluation);
      monitor::TimelineSpan span("evaluation", "eval");
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
      toBoard(step, {{"eval/top1", r.top1}, {"eval/top5", r.top5}, {"eval/loss", r.loss}});
      log::info("eval after epoch {}: top-1 {:.4f}, top-5 {:.4f}, loss {:.4f} ({} images, {:.1f} s)",
                epoch, r.top1, r.top5, r.loss, r.samples, r.seconds);
      model->train();
    }
  }

  monitor::setPhase(monitor::Phase::finishing);
  summary.steps = step;
  summary.seconds = secondsSince(runStart);
  if (checkpointer) {
    checkpointer->flush();
    summary.checkpoints = checkpointer->stats();
    log::info("checkpoints: {} taken, {} skipped, {} failed; training blocked {:.3f} ms per "
              "checkpoint on average, {:.3f} ms at most",
              summary.checkpoints.taken, summary.checkpoints.skipped, summary.checkpoints.failed,
              summary.checkpoints.taken + summary.checkpoints.skipped > 0
                  ? 1000 * summary.checkpoints.blockedSeconds /
                        double(summary.checkpoints.taken + summary.checkpoints.skipped)
                  : 0.0,
              1000 * summary.checkpoints.maxBlockedSeconds);
  }
  // stopReq.graceful stays set: a SIGTERM from here on changes nothing, as
  // this rank is finishing anyway.
  if (summary.stopped) return summary;
  const ddp::DdpStats ds = ddp.stats();
  log::info("gradient exchanges: {}; bucket allreduces started during backward: {}, after it: {}; "
            "path: {}",
            ds.syncs, ds.launchedDuringBackward, ds.launchedAtFinish, ddp::exchangeName(ds.exchange));
  summary.imagesPerS = trainSeconds > 0 ? double(summary.images) / trainSeconds : 0;
  at::Tensor waits = torch::tensor(
      {trainSeconds > 0 ? waitTotal / trainSeconds : 0.0, double(summary.corruptSkipped)},
      torch::kFloat64);
  comm::allreduceSum(comm, waits, "data wait summary");
  summary.dataWaitFrac = waits[0].item<double>() / world;
  summary.corruptSkipped = static_cast<int64_t>(waits[1].item<double>());

  ddp.syncBuffers();  // the saved BatchNorm statistics are rank 0's, as during training
  if (rank == 0 && job.output.saveFinal) {
    const security::Keyring* keys = security::installedKeyring();
    const bool seal = keys != nullptr && job.security.encryption.finalModel;
    ckpt::saveStateDict(ckpt::stateDict(*model), runDir.finalModel(), seal ? &keys->current : nullptr);
    log::info("saved {}", runDir.finalModel());
  }
  return summary;
}

void writeSummary(const JobConfig& job, const TrainSummary& s, const RunDir& runDir,
                  int worldSize) {
  nlohmann::json j;
  j["job"] = job.name;
  j["status"] = s.stopped ? "stopped" : "completed";
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
  j["corrupt_skipped"] = s.corruptSkipped;
  j["nonfinite_skipped"] = s.nonfiniteSkipped;
  if (s.phases.steps > 0) {
    const double k = 1000.0 / double(s.phases.steps);
    j["phase_ms_per_step"] = {{"data_wait", k * s.phases.dataWait},
                              {"forward", k * s.phases.forward},
                              {"backward", k * s.phases.backward},
                              {"exposed_comm", k * s.phases.exposedComm},
                              {"optimizer", k * s.phases.optimizer}};
  }
  j["compute"] = toJson(s.compute);
  j["restart_count"] = s.restartCount;
  if (s.resumedFromStep >= 0) {
    j["resumed_from"] = {{"step", s.resumedFromStep}, {"checkpoint", s.resumedFrom}};
  }
  if (job.checkpoint.enabled) {
    const auto& c = s.checkpoints;
    j["checkpoints"] = {{"dir", checkpointDir(job, runDir)},
                        {"taken", c.taken},
                        {"skipped", c.skipped},
                        {"failed", c.failed},
                        {"blocked_ms_mean", c.taken + c.skipped > 0
                                                ? 1000 * c.blockedSeconds / double(c.taken + c.skipped)
                                                : 0.0},
                        {"blocked_ms_median", 1000 * c.medianBlockedSeconds},
                        {"blocked_ms_max", 1000 * c.maxBlockedSeconds},
                        {"blocked_ms_total", {{"mark", 1000 * c.markSeconds},
                                              {"wait_before_step", 1000 * c.copyWaitSeconds}}},
                        {"bytes_written", c.bytesWritten}};
  }
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
