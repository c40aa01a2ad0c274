// setUp() and resume(): the first two parts of a rank's training
// (train/detail/state.h).

#include "train/detail/state.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "cohort/ckpt/rank_state.h"
#include "cohort/ckpt/resume.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/health/health.h"
#include "cohort/models/lora.h"
#include "cohort/monitor/activity.h"
#include "cohort/monitor/metrics.h"
#include "cohort/security/keys.h"
#include "cohort/train/optimizer.h"
#include "core/detail/json_int.h"
#include "train/detail/memory_fit.h"
#include "train/detail/optimizer_cut.h"
#include "train/detail/stages.h"
#include "train/detail/utilization.h"
#include "cohort/parallel/pipeline.h"

namespace cohort::train::detail {

namespace {

// Reads and checks the checkpoint a run resumes from (none: nullopt), and
// drops the records metrics.jsonl holds past its step (rank 0), before the
// file is opened for appending: the resumed run writes them again. A fresh
// start drops them all (an earlier attempt that restarted before its first
// checkpoint wrote some).
std::optional<ckpt::Manifest> readResume(const JobConfig& job, const comm::Comm& comm,
                                         const RunDir& runDir, const std::string& from) {
  std::optional<ckpt::Manifest> resume;
  if (!from.empty()) {
    resume = ckpt::readManifest(from);
    const auto changed = ckpt::checkResumable(*resume, job, comm.worldSize, from);
    if (comm.rank == 0 && !changed.empty()) {
      log::warn("resuming with a changed job: {}", fmt::join(changed, "; "));
    }
  }
  if (comm.rank == 0) monitor::dropRecordsAfter(runDir.metrics(), resume ? resume->step : 0);
  return resume;
}

// model.lora without model.init_from: the frozen weights are random, drawn
// from training.seed, and no other file holds them. Rank 0 writes them to
// model/base.pt, so that export, serve, score and generate compute with the
// base the adapters were trained beside: at every fresh start (a run
// directory used again gets this run's), and on a resume (checked against
// the checkpoint's digest already) when it is missing.
// At ZeRO stage 3 the base is in parts (ModelSetup::frozenUnits): every
// rank takes part, and rank 0 writes it one unit at a time.
void saveFrozenBase(const TrainState& s) {
  const JobConfig& job = s.job;
  const comm::Comm& comm = s.comm;
  const RunDir& runDir = s.runDir;
  if (job.model.lora.rank == 0 || !job.model.initFrom.empty()) return;
  std::error_code ec;
  const bool write = !s.resumed || !std::filesystem::exists(runDir.frozenBase(), ec);
  if (s.model.frozenUnits) {
    if (comm::shareFromRoot(comm, "write model/base.pt", write ? "yes" : "no") != "yes") return;
    parallel::UnitWrite base;
    base.keep = [](const std::string& name) { return !models::isAdapterName(name); };
    base.value = [](const std::string&, const at::Tensor& t) { return t; };
    base.trainable = false;  // the adapters are not in it
    s.plan->writeByUnit(runDir.frozenBase(), WeightsFormat::pt, finalModelKey(job), base);
  } else if (comm.rank == 0 && write) {
    ckpt::saveStateDict(models::frozenStateDict(*s.model.model), runDir.frozenBase(), finalModelKey(job));
  }
  if (comm.rank == 0 && write) {
    log::info("saved {} (the frozen weights: model.lora without model.init_from{})", runDir.frozenBase(),
              s.model.frozenUnits ? ", one unit at a time" : "");
  }
}

// A LoRA checkpoint continues only beside the frozen weights it was trained on.
void checkFrozenBase(const TrainState& s) {
  const std::string digest = s.resumed->extra.value("lora_base_digest", "");
  if (digest == s.model.frozenDigest) return;
  throw DataError(fmt::format(
      "cannot resume from {}: its LoRA adapters were trained on other frozen weights than "
      "model.init_from ({}) holds now (digest {} there, {} here)",
      s.options.resumeFrom, s.job.model.initFrom.empty() ? "none" : s.job.model.initFrom,
      digest.empty() ? "none" : digest, s.model.frozenDigest.empty() ? "none" : s.model.frozenDigest));
}

// Whether the state this rank will hold of `model` (its part, or the
// shapes of it) fits its memory share (checkStateFits: throws ConfigError,
// or returns a warning).
std::string checkFits(const TrainState& s, const models::Model& model, bool byUnit) {
  const JobConfig& job = s.job;
  const std::vector<std::string> units = job.distribution.zero == 3 ? model.shardingUnits()
                                                                     : std::vector<std::string>{};
  const StateBytes need = stateBytes(model, job.distribution.zero, s.mesh.replicas, units,
                                    job.training.optimizer, job.distribution.bucketCapMb, byUnit);
  return checkStateFits(need, s.memory.limit, s.memory.sharers, s.comm.rank, s.comm.worldSize,
                        job.distribution.zero);
}

// A model built unit by unit is checked before it is built, from its
// shapes alone (no values made), so that a state that cannot fit allocates
// nothing.
void checkFitBeforeBuild(const TrainState& s, const models::ModelPart& part) {
  models::ShapesOnly shapes;
  models::ModelPart p = part;
  p.sink = &shapes;
  p.exact = false;
  const ModelConfig mc = resolveModelConfig(s.job, s.datasets);
  const auto model = models::createModel(mc, {mc.inChannels, s.datasets.shape.height, s.datasets.shape.width}, p);
  if (mc.lora.rank > 0) models::attachLora(*model, mc.lora);  // what trains, and what is frozen
  checkFits(s, *model, true);
}

// The parallel plan over this rank's part of the model, after checking
// that the state it will hold can fit (before gradients and optimizer state
// exist: a state that cannot fit is a configuration error now, not an OOM
// kill later).
std::unique_ptr<parallel::Plan> makePlan(const TrainState& s) {
  const JobConfig& job = s.job;
  models::Model& model = *s.model.model;
  parallel::DdpOptions options = ddpOptions(job);
  if (job.distribution.zero == 3) options.units = model.shardingUnits();
  if (s.model.units) options.presharded = s.model.units->release();
  if (s.model.frozenUnits) {
    options.shardFrozen = true;
    options.frozenPresharded = s.model.frozenUnits->release();
  }
  const std::string tight = checkFits(s, model, s.model.units != nullptr || s.model.frozenUnits != nullptr);
  if (!tight.empty()) log::warn("{}", tight);
  std::unique_ptr<parallel::Plan> plan;
  if (s.mesh.pipelined()) {
    const PipelineConfig& pc = job.distribution.pipeline;
    parallel::PipelineOptions po;
    po.microBatches = static_cast<int>(pc.microBatchCount());
    po.schedule = pc.schedule == PipelineSchedule::gpipe ? parallel::ScheduleKind::gpipe
                                                          : parallel::ScheduleKind::oneFOneB;
    // A token embedding that is the output head too: the first and the last stage hold it.
    po.tied = models::tiedAcrossStages(job.model);
    po.sharedMemory = job.distribution.sharedMemory;
    po.maxBatch = std::max(job.training.batchSize, evalBatchSize(job));
    plan = parallel::pipeline(s.mesh, s.model.model, options, po);
  } else if (s.mesh.tensorSplit()) {
    plan = parallel::tensorParallel(s.mesh, s.model.model, options);
  } else {
    plan = parallel::dataParallel(s.mesh, s.model.model, options);
  }
  plan->start();
  log::info("gradient buckets: {} (cap {} MiB)", plan->stats().buckets,
            job.distribution.bucketCapMb);
  return plan;
}

// What a pipeline stage holds of the model.
void logStage(const TrainState& s, const models::ModelPart& part) {
  std::vector<std::string> also;
  const bool decoder = decoderArch(s.job.model.arch);
  if (part.input) also.push_back(decoder ? "the embeddings" : "the stem");
  if (part.output) also.push_back(decoder ? "the final norm and the head" : "the classifier");
  log::info("pipeline: {} holds blocks {}..{} of {}{}{}: {} parameters", s.mesh.describe(),
            part.firstBlock, part.endBlock - 1, pipelineBlocks(s.job.model),
            also.empty() ? "" : " with ", fmt::join(also, " and "), s.model.parameters);
}

// The ZeRO log lines: what this rank steps and, at stage 3, gathers.
void logZero(const TrainState& s) {
  const parallel::DdpStats ds = s.plan->stats();
  const int64_t stage = s.job.distribution.zero;
  log::info("ZeRO stage {}: this rank steps {} of {} parameter elements (with padding)", stage,
            ds.optimizerElements,
            stage == 3 ? ds.optimizerElements * s.mesh.replicas : ds.parameterElements);
  if (stage == 3) {
    log::info("ZeRO stage 3: parameters gathered in {} units ({} of the model's blocks, and the "
              "parameters outside them), one at a time",
              ds.buckets, s.plan->model().shardingUnits().size());
  }
}

// The optimizer over what the plan steps (frozen weights, model.lora, have
// no optimizer state; with ZeRO this rank's part of each bucket).
void makeOptimizer(TrainState& s) {
  s.optimizerNames = s.plan->optimizerNames();
  s.zero = s.plan->zeroLayout();
  s.optimizer = createOptimizer(s.job.training.optimizer, s.plan->optimizerParameters());
  if (!s.zero.is_null()) logZero(s);
}

// The loop's parts: reporter, step runner, checkpoint policy, sample log.
void makeLoopParts(TrainState& s) {
  const JobConfig& job = s.job;
  TrainSummary& summary = s.summary;
  summary.compute = s.model.compute;
  summary.parameters = s.model.parameters;
  summary.trainableParameters = s.model.trainable;
  summary.peakLr = s.steps.peakLr;
  summary.globalBatch = s.steps.globalBatch;
  summary.restartCount = s.options.restartCount;
  s.reporter = std::make_unique<Reporter>(job, s.comm, s.runDir, *s.loaders.train, summary.phases,
                                          s.mesh.stages * s.mesh.tensors, &summary.utilization);
  s.runner = std::make_unique<StepRunner>(job, *s.plan, *s.optimizer, s.faults, summary.phases,
                                          s.model.precision);
  s.checkpoints = std::make_unique<CheckpointPolicy>(job, *s.plan, s.runDir, *s.optimizer,
                                                     s.optimizerNames, s.steps, s.memory);
  s.checkpoints->recordLossScale(s.runner->lossScaler());
  s.checkpoints->recordLoraBase(s.model.frozenDigest);
  if (!s.zero.is_null()) s.checkpoints->recordZero(s.zero);
  if (job.distribution.zero == 3) s.checkpoints->writeParametersInParts(*s.plan);
  if (s.mesh.tensorSplit()) s.checkpoints->recordTensor(s.plan->tensorLayout());
  if (s.mesh.pipelined()) {
    nlohmann::json layout = pipelineLayout(job, s.mesh, s.split);
    layout["stage_zero"] = gatherStageLayouts(s.mesh, s.checkpoints->zeroLayout());
    s.checkpoints->recordPipeline(std::move(layout));
  }
  // Every rank of a replica trains on its samples: its first rank logs them.
  s.samples = std::make_unique<SampleLog>(s.options.restartCount, s.mesh.stage == 0 && s.mesh.tensorRank == 0);
}

// This rank's own state in the checkpoint: its random generator (and
// buffers, when they are not broadcast).
void restoreRankState(const TrainState& s) {
  const int rank = s.comm.rank;
  const ckpt::Manifest& m = *s.resumed;
  const std::string& from = s.options.resumeFrom;
  bool held = false;  // the checkpoint holds this rank's state (a node lost may have taken it)
  for (const auto& f : m.files) held = held || f.name == ckpt::rankStateFile(rank);
  if (rank < m.worldSize && held) {
    ckpt::restoreRankState(from, rank, s.plan->model());
  } else if (rank < m.worldSize) {
    log::info("rank {}: {} holds no state of this rank (its node was lost): its random state "
              "starts from training.seed", rank, from);
  } else {
    // A rank the checkpoint's run did not have: its dropout draws from
    // the seed; its buffers are rank 0's from model.bin.
    log::info("rank {} is new to {} (written by {} ranks): its random state starts from "
              "training.seed", rank, from, m.worldSize);
  }
}

// The run's steps when it resumes: those done, the rest of the epoch in
// this layout, and the epochs after it. (The same as epochs x steps per
// epoch when every epoch ran in this layout; not after a resume in another.)
void planResumedSteps(TrainState& s) {
  const TrainingConfig& tc = s.job.training;
  const ckpt::Manifest& m = *s.resumed;
  StepPlan& plan = s.steps;
  const data::DistributedSampler& sampler = *s.loaders.trainSampler;
  const ResumeAt& at = s.at;
  const StepPlan first =
      at.relaid ? plan.takenUpWith(sampler.sharedSamplesPerRank(at.from), sampler.samplesPerRank(at.from))
                : plan;
  const int64_t doneInEpoch = at.relaid ? 0 : (at.batch + plan.accumulate - 1) / plan.accumulate;
  plan.totalSteps = m.step + std::max<int64_t>(0, first.stepsPerEpoch - doneInEpoch) +
                    plan.stepsPerEpoch * std::max<int64_t>(0, tc.epochs - at.epoch);
  if (tc.maxSteps > 0) plan.totalSteps = std::min(plan.totalSteps, tc.maxSteps);
}

void restoreLossScale(const TrainState& s) {
  LossScaler* scaler = s.runner->lossScaler();
  if (scaler == nullptr || !s.resumed->extra.contains("loss_scale")) return;
  const nlohmann::json& ls = s.resumed->extra["loss_scale"];
  scaler->restore({ls.value("scale", scaler->scale()), jsonInt(ls, "good_steps", int64_t{0})});
  log::info("loss scale {} restored ({} good steps towards growth)", scaler->scale(),
            scaler->state().goodSteps);
}

// Where the run goes on, in the log and metrics.jsonl.
void reportResume(TrainState& s) {
  const ckpt::Manifest& m = *s.resumed;
  const std::string& from = s.options.resumeFrom;
  const StepPlan& plan = s.steps;
  s.step = m.step;
  monitor::setStep(s.step);
  s.summary.resumedFromStep = s.step;
  s.summary.resumedFrom = from;
  if (s.at.batch > plan.batchesPerEpoch) {
    throw ConfigError(fmt::format("cannot resume from {}: it is at batch {} of epoch {}, which "
                                  "has {} batches in this job",
                                  from, s.at.batch, s.at.epoch, plan.batchesPerEpoch));
  }
  if (s.at.relaid) {
    log::info("resumed from {}: step {}, epoch {} from sample {} of its order (written by {} "
              "ranks with batch {}, cut now for {} x batch {})",
              from, s.step, s.at.epoch, m.samplesInEpoch, m.worldSize,
              jsonInt(m.extra, "batch_size", s.job.training.batchSize), s.mesh.replicas,
              s.job.training.batchSize);
  } else {
    log::info("resumed from {}: step {}, epoch {}, batch {} of {} (sample {} of the epoch)", from,
              s.step, s.at.epoch, s.at.batch, plan.batchesPerEpoch, m.samplesInEpoch);
  }
  s.reporter->event({{"event", "resume"},
                     {"step", s.step},
                     {"from", from},
                     {"restart_count", s.options.restartCount}});
}

}  // namespace

TrainState::TrainState(const JobConfig& j, const parallel::Mesh& m, const RunDir& r,
                       const TrainOptions& o)
    : job(j), mesh(m), comm(m.world), runDir(r), options(o), faults(m.world.rank, o.restartCount) {}

TrainState::~TrainState() = default;

void setUp(TrainState& s) {
  const JobConfig& job = s.job;
  const TrainingConfig& tc = job.training;
  // distribution.preflight: refuse to start on unfit hardware, before the
  // loader threads and the model compete with the measurements.
  if (job.distribution.preflight) {
    monitor::setPhase(monitor::Phase::starting);
    health::preflight(s.comm, job.health, s.runDir.root);
  }
  s.memory = memoryShare(s.comm);
  log::info("memory limit: {}, {:.0f} MB each", s.memory.describe(), s.memory.bytes() / (1 << 20));
  s.datasets = openDatasets(job);
  s.resumed = readResume(job, s.comm, s.runDir, s.options.resumeFrom);
  s.split = resolveSplit(job, s.datasets, s.mesh, s.resumed, s.options.resumeFrom, s.restaged);
  const models::ModelPart part = partOf(s.split, s.mesh.stage);
  if (buildsByUnit(job)) checkFitBeforeBuild(s, part);
  env::pauseForTest("model");
  s.model = buildModel(job, s.datasets, s.mesh, s.options.resumeFrom, part, s.restaged);
  s.summary.utilization = measureUtilization(s.model.config, s.datasets.shape.height, s.datasets.shape.width,
                                             s.model.precision, s.model.compute, s.comm);
  if (s.mesh.pipelined()) logStage(s, part);
  if (s.resumed && !s.model.frozenUnits) checkFrozenBase(s);
  // Before the plan, which shards the parameters at ZeRO stage 3 (with
  // the base in parts already, after it).
  if (!s.model.frozenUnits) saveFrozenBase(s);
  s.plan = makePlan(s);
  if (s.model.frozenUnits) {
    s.model.frozenDigest = s.plan->frozenDigestByUnit();
    if (s.resumed) checkFrozenBase(s);
    saveFrozenBase(s);
  }
  // Dropout differs per rank, as each rank sees different samples.
  torch::manual_seed(static_cast<uint64_t>(tc.seed) * 1000003ull +
                     static_cast<uint64_t>(s.comm.rank) + 1);
  s.loaders = makeLoaders(job, s.datasets, s.plan->dataRank(), s.plan->dataWorld());
  s.steps = planSteps(job, s.loaders.trainSampler->sharedSamplesPerRank(), s.plan->dataWorld(),
                      s.loaders.trainSampler->samplesPerRank());
  makeOptimizer(s);
  makeLoopParts(s);
}

void resume(TrainState& s) {
  const TrainingConfig& tc = s.job.training;
  if (s.resumed) {
    restoreRankState(s);
    s.at = resumePosition(*s.resumed, s.job, s.comm.worldSize, s.datasets.train->size());
    planResumedSteps(s);
  }
  s.schedule = std::make_unique<LrSchedule>(tc.schedule, s.steps.peakLr, s.steps.stepsPerEpoch,
                                            s.steps.totalSteps);
  if (s.resumed && s.at.relaid) {
    // Counted in epochs of data, not in the steps of a layout this run does
    // not have (docs/elastic.md, "Learning rate").
    s.schedule->anchor(s.resumed->step, static_cast<double>(s.at.epoch - 1) +
                                            static_cast<double>(s.at.from) /
                                                static_cast<double>(s.datasets.train->size()));
  }
  if (s.resumed) {
    restoreOptimizer(*s.optimizer, s.optimizerNames, *s.plan, s.zero, s.options.resumeFrom, *s.resumed,
                     s.restaged);
  }
  log::info("{} {} x batch {} x {} micro-steps = global batch {}; peak lr {:.6g}; {} steps "
            "per epoch, {} in all",
            s.mesh.replicas, s.mesh.pipelined() || s.mesh.tensorSplit() ? "data replicas" : "ranks", tc.batchSize,
            s.steps.accumulate, s.steps.globalBatch, s.steps.peakLr, s.steps.stepsPerEpoch,
            s.steps.totalSteps);
  s.summary.globalBatch = s.steps.globalBatch;
  s.summary.stepsPerEpoch = s.steps.stepsPerEpoch;
  s.summary.epochSamples = s.steps.perRank * s.mesh.replicas;
  if (!s.resumed) return;
  restoreLossScale(s);
  reportResume(s);
}

}  // namespace cohort::train::detail
