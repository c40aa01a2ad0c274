#include "cohort/train/trainer.h"

// The path of one rank (docs/architecture.md, "The path of one step"):
//
//   train()     set-up (setup.h: data, model, exchange, loaders, plan),
//               resume (ckpt/resume.h, ckpt/rank_state.h), the parts below,
//               then the epochs and the finish
//   Loop        one epoch of steps: StepRunner (step.h) for the step itself,
//               Reporter (reporting.h) for records, CheckpointPolicy
//               (checkpoint_policy.h) for checkpoints and the stop protocol;
//               evaluation (evaluate.h) after the epochs that ask for it

#include <fmt/format.h>
#include <torch/torch.h>

#include <sys/resource.h>

#include <filesystem>
#include <optional>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/rank_state.h"
#include "cohort/ckpt/resume.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/comm/wait.h"
#include "cohort/core/env.h"
#include "cohort/core/exit_codes.h"
#include "cohort/models/lora.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/time.h"
#include "cohort/monitor/activity.h"
#include "cohort/health/health.h"
#include "cohort/monitor/timeline.h"
#include "cohort/security/keys.h"
#include "cohort/train/lr_schedule.h"
#include "cohort/train/optimizer.h"
#include "train/detail/checkpoint_policy.h"
#include "train/detail/memory_fit.h"
#include "train/detail/evaluate.h"
#include "train/detail/optimizer_cut.h"
#include "train/detail/faults.h"
#include "train/detail/reporting.h"
#include "train/detail/setup.h"
#include "train/detail/step.h"
#include "core/detail/json_int.h"

namespace cohort::train {
namespace {

using namespace detail;

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

// The training loop's parts, set up, and where it is.
struct Loop {
  const JobConfig& job;
  const comm::Comm& comm;
  const StepPlan& plan;
  models::Model& model;
  ddp::DistributedDataParallel& ddp;
  const data::Dataset& trainSet;
  Loaders& loaders;
  StepRunner& runner;
  Reporter& reporter;
  CheckpointPolicy& checkpoints;
  const LrSchedule& schedule;
  const FaultPlan& faults;
  SampleLog& samples;
  TrainSummary& summary;
  int64_t step = 0;
  double trainSeconds = 0;  // in the epochs' steps
  double waitSeconds = 0;   // of which waiting for batches

  // Trains `epoch` from its micro-batch `startBatch`, the epoch taken up at
  // position `from` of its order (a resume in another layout; 0: from its
  // start). Returns true when training ends with it: the last step is
  // done, or a stop request was served (summary.stopped).
  bool runEpoch(int64_t epoch, int64_t startBatch, int64_t from);
  // Evaluates after `epoch` when data.eval is set and training.eval_every
  // asks for it, or `last`.
  void evaluateAfter(int64_t epoch, bool last);
};

bool Loop::runEpoch(int64_t epoch, int64_t startBatch, int64_t from) {
  data::BatchLoader& loader = *loaders.train;
  const data::DistributedSampler& sampler = *loaders.trainSampler;
  const StepPlan ep = from > 0 ? plan.takenUpWith(sampler.sharedSamplesPerRank(from),
                                                  sampler.samplesPerRank(from))
                               : plan;
  checkpoints.startEpoch(from, ep);
  std::vector<int64_t> order = loaders.trainSampler->indices(epoch - 1, from);
  if (samples.enabled()) samples.startEpoch(order, ep.batchSize);
  loader.startEpoch(std::move(order), epoch, startBatch);
  reporter.startEpoch(epoch, std::min(ep.stepsPerEpoch - startBatch / ep.accumulate,
                                      plan.totalSteps - step));
  bool end = false;
  for (int64_t micro = startBatch;;) {
    monitor::setPhase(monitor::Phase::data);
    auto batch = [&] {
      monitor::TimelineSpan span("data wait", "data");
      return loader.next();
    }();
    if (!batch) break;
    const Cycle cycle = ep.cycleOf(micro);
    if (samples.enabled()) samples.microBatch(step + 1, epoch, batch->index, batch->labels.size(0));
    const double loss = runner.microBatch(*batch, cycle, micro, step);
    reporter.microBatch(loss, batch->labels.size(0), batch->skipped);
    summary.corruptSkipped += batch->skipped;
    ++micro;
    if (!cycle.last) continue;

    const double lr = schedule.at(step);
    const StepRunner::Update u = runner.update(lr, step, epoch, checkpoints.checkpointer());
    if (!u.applied && u.lossScale > 0) {
      log::warn("step {}: gradients overflowed ({}): update skipped, loss scale backs off to {}, "
                "{} in a row",
                step + 1, u.why, u.lossScale, u.nonfiniteInARow);
      reporter.event({{"event", "loss_scale_backoff"},
                      {"step", step + 1},
                      {"scale", u.lossScale},
                      {"in_a_row", u.nonfiniteInARow}});
    } else if (!u.applied) {
      log::warn("step {}: non-finite gradient ({}): update skipped (training.on_nonfinite: "
                "skip), {} in a row",
                step + 1, u.why, u.nonfiniteInARow);
      reporter.event({{"event", "nonfinite_skipped"},
                      {"step", step + 1},
                      {"in_a_row", u.nonfiniteInARow}});
    }
    ++step;
    monitor::setStep(step);
    if (samples.enabled()) samples.stepDone(step);
    checkpoints.markBoundary(step, epoch, micro, lr);
    if (u.gradNorm >= 0) reporter.board(step, {{"train/grad_norm", u.gradNorm}});
    faults.afterStep(step);
    reporter.stepDone(step, epoch, lr);
    if (checkpoints.afterStep(step, epoch, micro, lr, reporter)) {
      summary.stopped = true;
      summary.reformed = checkpoints.reformed();
    }
    if (summary.stopped || step >= plan.totalSteps) {
      end = true;
      break;
    }
  }

  const EpochTotals t = reporter.endEpoch();
  const int world = comm.worldSize;
  trainSeconds += t.seconds;
  waitSeconds += t.waitSeconds;
  summary.phases.dataWait += t.waitSeconds;
  summary.images += t.images * world;
  summary.epochs = epoch;
  const double perSecond = t.seconds > 0 ? double(t.images) * world / t.seconds : 0.0;
  if (tokenModel(job)) {
    log::info("epoch {}/{}: {} steps in {:.1f} s, loss {:.4f}, {:.0f} tokens/s", epoch,
              job.training.epochs, t.steps, t.seconds, t.meanLoss,
              perSecond * double(job.model.blockSize));
  } else {
    log::info("epoch {}/{}: {} steps in {:.1f} s, loss {:.4f}, {:.0f} img/s", epoch,
              job.training.epochs, t.steps, t.seconds, t.meanLoss, perSecond);
  }
  if (const std::string io = trainSet.ioSummary(); !io.empty()) {
    log::info("training data after epoch {}: {}", epoch, io);
  }
  return end;
}

void Loop::evaluateAfter(int64_t epoch, bool last) {
  const int64_t every = job.training.evalEvery;
  const bool due = every > 0 && epoch % every == 0;
  if (!loaders.eval || !(due || last) || summary.stopped) return;
  monitor::setPhase(monitor::Phase::evaluation);
  monitor::TimelineSpan span("evaluation", "eval");
  ddp.syncBuffers();
  const auto start = SteadyClock::now();
  monitor::EvalRecord r =
      evaluate(model, *loaders.eval, *loaders.evalSampler, comm, runner.precision());
  r.step = step;
  r.epoch = epoch;
  r.seconds = secondsSince(start);
  reporter.evaluation(r);
  summary.evaluated = true;
  summary.lastEval = r;
  summary.bestTop1 = std::max(summary.bestTop1, r.top1);
  if (r.tokens > 0) {
    log::info("eval after epoch {}: loss {:.4f}, perplexity {:.3f}, next-token top-1 {:.4f} ({} "
              "tokens, {:.1f} s)",
              epoch, r.loss, r.perplexity, r.top1, r.tokens, r.seconds);
  } else {
    log::info("eval after epoch {}: top-1 {:.4f}, top-5 {:.4f}, loss {:.4f} ({} images, {:.1f} s)",
              epoch, r.top1, r.top5, r.loss, r.samples, r.seconds);
  }
  model.train();
}

// The key model/ files are sealed with (security.encryption.final_model).
const security::Key* modelKey(const JobConfig& job) {
  const security::Keyring* keys = security::installedKeyring();
  return keys != nullptr && job.security.encryption.finalModel ? &keys->current : nullptr;
}

// model.lora without model.init_from: the frozen weights are random, drawn
// from training.seed, and no other file holds them. Rank 0 writes them to
// model/base.pt, so that export, serve, score and generate compute with the
// base the adapters were trained beside: at every fresh start (a run
// directory used again gets this run's), and on a resume (checked against
// the checkpoint's digest already) when it is missing.
void saveFrozenBase(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir,
                    const models::Model& model, bool resuming) {
  std::error_code ec;
  if (comm.rank != 0 || job.model.lora.rank == 0 || !job.model.initFrom.empty() ||
      (resuming && std::filesystem::exists(runDir.frozenBase(), ec))) {
    return;
  }
  ckpt::saveStateDict(models::frozenStateDict(model), runDir.frozenBase(), modelKey(job));
  log::info("saved {} (the frozen weights: model.lora without model.init_from)", runDir.frozenBase());
}

// After the last epoch (not after a stop): the exchange's counts, the data
// wait over all ranks, and rank 0's model/final.pt.
void finishTraining(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir,
                    ddp::DistributedDataParallel& ddp, models::Model& model, const Loop& loop,
                    TrainSummary& summary) {
  const ddp::DdpStats ds = ddp.stats();
  log::info("gradient exchanges: {}; bucket allreduces started during backward: {}, after it: {}; "
            "path: {}",
            ds.syncs, ds.launchedDuringBackward, ds.launchedAtFinish, ddp::exchangeName(ds.exchange));
  const double trainSeconds = loop.trainSeconds;
  summary.imagesPerS = trainSeconds > 0 ? double(summary.images) / trainSeconds : 0;
  at::Tensor waits = torch::tensor(
      {trainSeconds > 0 ? loop.waitSeconds / trainSeconds : 0.0, double(summary.corruptSkipped)},
      torch::kFloat64);
  comm::allreduceSum(comm, waits, "data wait summary");
  summary.dataWaitFrac = waits[0].item<double>() / comm.worldSize;
  summary.corruptSkipped = static_cast<int64_t>(waits[1].item<double>());

  ddp.syncBuffers();  // the saved BatchNorm statistics are rank 0's, as during training
  // ZeRO stage 3: the parameters are gathered on rank 0 for the save.
  if (job.output.saveFinal) ddp.gatherAllParameters(/*root=*/0);
  if (comm.rank == 0 && job.output.saveFinal) {
    const security::Key* key = modelKey(job);
    if (models::hasAdapters(model)) {
      summary.loraBaseDigest = models::frozenDigest(model);  // the same as before training
      ckpt::saveStateDict(models::adapterStateDict(model), runDir.adapters(), key);
      log::info("saved {}", runDir.adapters());
      if (job.output.mergeLora) {
        ckpt::saveStateDict(models::mergedStateDict(model), runDir.finalModel(), key);
        log::info("saved {} (adapters merged)", runDir.finalModel());
      }
    } else {
      ckpt::saveStateDict(models::publishedStateDict(model), runDir.finalModel(), key);
      log::info("saved {}", runDir.finalModel());
    }
  }
  ddp.releaseParameters();
}

// Under `cohort agent`, a collective that failed (a peer lost, or abandoned
// on the agent's word) ends the round. Between two steps, the state this
// rank holds is whole: it is kept in the node's memory for the next round
// (unless no step was completed since the round began), and the rank exits
// kExitStateHeld at once, without unwinding what the broken collective
// left behind. Inside a step, the error goes on as any other.
void holdAfterFailure(const Error& e, CheckpointPolicy& checkpoints, int64_t step, int64_t resumed) {
  const bool collective = dynamic_cast<const CommError*>(&e) != nullptr ||
                          dynamic_cast<const TimeoutError*>(&e) != nullptr;
  if (!env::elasticStateDir() || !collective || stateMutatingFlag().load()) return;
  log::warn("the round broke at step {} ({}): holding the state of the last step in memory", step + 1,
            e.what());
  comm::abandonCollectives();
  try {
    const int64_t held = checkpoints.holdLastBoundary(resumed);
    if (held < 0) log::info("no step completed in this round: nothing new to hold");
  } catch (const std::exception& err) {
    log::error("could not hold the state: {}", err.what());
    return;
  }
  log::flush();
  std::_Exit(kExitStateHeld);
}

}  // namespace

TrainSummary train(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir,
                   const TrainOptions& options) {
  const TrainingConfig& tc = job.training;
  const int rank = comm.rank;
  const FaultPlan faults(rank, options.restartCount);
  // distribution.preflight: refuse to start on unfit hardware, before the
  // loader threads and the model compete with the measurements.
  if (job.distribution.preflight) {
    monitor::setPhase(monitor::Phase::starting);
    health::preflight(comm, job.health, runDir.root);
  }

  // Set-up: data, the resumed checkpoint's checks, model, exchange.
  const Datasets datasets = openDatasets(job);
  const std::optional<ckpt::Manifest> resume = readResume(job, comm, runDir, options.resumeFrom);
  ModelSetup ms = buildModel(job, datasets, comm, options.resumeFrom);
  models::Model& model = *ms.model;
  if (resume) {
    const std::string digest = resume->extra.value("lora_base_digest", "");
    if (digest != ms.frozenDigest) {
      throw DataError(fmt::format(
          "cannot resume from {}: its LoRA adapters were trained on other frozen weights than "
          "model.init_from ({}) holds now (digest {} there, {} here)",
          options.resumeFrom, job.model.initFrom.empty() ? "none" : job.model.initFrom,
          digest.empty() ? "none" : digest, ms.frozenDigest.empty() ? "none" : ms.frozenDigest));
    }
  }
  // Before the exchange: at ZeRO stage 3 it shards the parameters.
  saveFrozenBase(job, comm, runDir, model, resume.has_value());
  ddp::DdpOptions ddpOpts = ddpOptions(job);
  if (job.distribution.zero == 3) ddpOpts.units = model.shardingUnits();
  // Before gradients and optimizer state exist: a state that cannot fit
  // is a configuration error now, not an OOM kill later.
  const std::string tight = checkStateFits(
      stateBytes(model, job.distribution.zero, comm.worldSize, ddpOpts.units, tc.optimizer,
                 ddpOpts.bucketCapMb),
      memory::processLimit(), comm.localWorldSize, rank, comm.worldSize, job.distribution.zero);
  if (!tight.empty()) log::warn("{}", tight);
  ddp::DistributedDataParallel ddp(ms.model, comm, ddpOpts);
  ddp.broadcastState();
  // Stage 3: the model runs each unit through the engine, which gathers
  // its parameters; never past the engine's life.
  model.setUnitRunner(ddp.unitRunner());
  struct RunnerUnset {
    models::Model& model;
    ~RunnerUnset() { model.setUnitRunner(nullptr); }
  } runnerUnset{model};
  log::info("gradient buckets: {} (cap {} MiB)", ddp.stats().buckets, job.distribution.bucketCapMb);
  // Dropout differs per rank, as each rank sees different samples.
  torch::manual_seed(static_cast<uint64_t>(tc.seed) * 1000003ull + static_cast<uint64_t>(rank) + 1);
  if (resume) {
    bool held = false;  // the checkpoint holds this rank's state (a node lost may have taken it)
    for (const auto& f : resume->files) held = held || f.name == ckpt::rankStateFile(rank);
    if (rank < resume->worldSize && held) {
      ckpt::restoreRankState(options.resumeFrom, rank, model);
    } else if (rank < resume->worldSize) {
      log::info("rank {}: {} holds no state of this rank (its node was lost): its random state "
                "starts from training.seed", rank, options.resumeFrom);
    } else {
      // A rank the checkpoint's run did not have: its dropout draws from
      // the seed above; its buffers are rank 0's from model.bin.
      log::info("rank {} is new to {} (written by {} ranks): its random state starts from "
                "training.seed", rank, options.resumeFrom, resume->worldSize);
    }
  }

  Loaders loaders = makeLoaders(job, datasets, comm);
  StepPlan plan = planSteps(job, loaders.trainSampler->sharedSamplesPerRank(), comm.worldSize,
                           loaders.trainSampler->samplesPerRank());
  ResumeAt at;
  if (resume) {
    at = resumePosition(*resume, job, comm.worldSize, datasets.train->size());
    // The run's steps: those done, the rest of the epoch in this layout,
    // and the epochs after it. (The same as epochs x steps per epoch when
    // every epoch ran in this layout; not after a resume in another.)
    const StepPlan first =
        at.relaid ? plan.takenUpWith(loaders.trainSampler->sharedSamplesPerRank(at.from),
                                     loaders.trainSampler->samplesPerRank(at.from))
                  : plan;
    const int64_t doneInEpoch = at.relaid ? 0 : (at.batch + plan.accumulate - 1) / plan.accumulate;
    plan.totalSteps = resume->step + std::max<int64_t>(0, first.stepsPerEpoch - doneInEpoch) +
                      plan.stepsPerEpoch * std::max<int64_t>(0, tc.epochs - at.epoch);
    if (tc.maxSteps > 0) plan.totalSteps = std::min(plan.totalSteps, tc.maxSteps);
  }
  LrSchedule schedule(tc.schedule, plan.peakLr, plan.stepsPerEpoch, plan.totalSteps);
  if (resume && at.relaid) {
    // Counted in epochs of data, not in the steps of a layout this run does
    // not have (docs/elastic.md, "Learning rate").
    schedule.anchor(resume->step, static_cast<double>(at.epoch - 1) +
                                      static_cast<double>(at.from) /
                                          static_cast<double>(datasets.train->size()));
  }
  // Frozen weights (model.lora) have no optimizer state. With ZeRO the
  // optimizer steps this rank's part of each bucket ("part<k>").
  std::vector<at::Tensor> trainable;
  std::vector<std::string> paramNames;
  const bool sharded = job.distribution.zero > 0;
  if (sharded) {
    trainable = ddp.optimizerParameters();
    for (size_t k = 0; k < trainable.size(); ++k) paramNames.push_back(fmt::format("part{}", k));
  } else {
    for (auto& [name, p] : models::trainableParameters(model)) {
      paramNames.push_back(name);
      trainable.push_back(p);
    }
  }
  const nlohmann::json zero = sharded ? zeroLayout(job, ddp, model, comm.worldSize) : nlohmann::json();
  auto optimizer = createOptimizer(tc.optimizer, trainable);
  if (resume) {
    restoreOptimizer(*optimizer, paramNames, ddp, model, zero, options.resumeFrom, *resume, rank);
  }
  if (sharded) {
    const ddp::DdpStats ds = ddp.stats();
    log::info("ZeRO stage {}: this rank steps {} of {} parameter elements (with padding)",
              job.distribution.zero, ds.optimizerElements,
              job.distribution.zero == 3 ? ds.optimizerElements * comm.worldSize : ds.parameterElements);
    if (job.distribution.zero == 3) {
      log::info("ZeRO stage 3: parameters gathered in {} units ({} of the model's blocks, and the "
                "parameters outside them), one at a time",
                ds.buckets, model.shardingUnits().size());
    }
  }
  log::info("{} ranks x batch {} x {} micro-steps = global batch {}; peak lr {:.6g}; {} steps "
            "per epoch, {} in all",
            comm.worldSize, tc.batchSize, tc.accumulateSteps, plan.globalBatch, plan.peakLr,
            plan.stepsPerEpoch, plan.totalSteps);

  TrainSummary summary;
  summary.compute = ms.compute;
  summary.parameters = ms.parameters;
  summary.trainableParameters = ms.trainable;
  summary.peakLr = plan.peakLr;
  summary.globalBatch = plan.globalBatch;
  summary.restartCount = options.restartCount;
  Reporter reporter(job, comm, runDir, *loaders.train, summary.phases);
  StepRunner runner(job, comm, model, ddp, *optimizer, faults, summary.phases, ms.precision);
  CheckpointPolicy checkpoints(job, comm, runDir, model, *optimizer, paramNames, plan);
  checkpoints.recordLossScale(runner.lossScaler());
  checkpoints.recordLoraBase(ms.frozenDigest);
  if (sharded) checkpoints.recordZero(zero);
  if (job.distribution.zero == 3) checkpoints.writeParametersInParts(ddp);
  if (LossScaler* scaler = runner.lossScaler(); resume && scaler && resume->extra.contains("loss_scale")) {
    const nlohmann::json& ls = resume->extra["loss_scale"];
    scaler->restore({ls.value("scale", scaler->scale()), jsonInt(ls, "good_steps", int64_t{0})});
    log::info("loss scale {} restored ({} good steps towards growth)", scaler->scale(),
              scaler->state().goodSteps);
  }
  SampleLog samples(options.restartCount);
  Loop loop{job,    comm,        plan,     model,  ddp,    *datasets.train, loaders,
            runner, reporter,    checkpoints, schedule, faults, samples, summary};

  // Where the resumed checkpoint left off.
  int64_t firstEpoch = at.epoch, firstBatch = at.batch;
  const auto runStart = SteadyClock::now();
  if (resume) {
    loop.step = resume->step;
    monitor::setStep(loop.step);
    summary.resumedFromStep = loop.step;
    summary.resumedFrom = options.resumeFrom;
    if (firstBatch > plan.batchesPerEpoch) {
      throw ConfigError(fmt::format("cannot resume from {}: it is at batch {} of epoch {}, which "
                                    "has {} batches in this job",
                                    options.resumeFrom, firstBatch, firstEpoch, plan.batchesPerEpoch));
    }
    if (at.relaid) {
      log::info("resumed from {}: step {}, epoch {} from sample {} of its order (written by {} "
                "ranks with batch {}, cut now for {} x batch {})",
                options.resumeFrom, loop.step, firstEpoch, resume->samplesInEpoch, resume->worldSize,
                jsonInt(resume->extra, "batch_size", tc.batchSize), comm.worldSize, tc.batchSize);
    } else {
      log::info("resumed from {}: step {}, epoch {}, batch {} of {} (sample {} of the epoch)",
                options.resumeFrom, loop.step, firstEpoch, firstBatch, plan.batchesPerEpoch,
                resume->samplesInEpoch);
    }
    reporter.event({{"event", "resume"},
                    {"step", loop.step},
                    {"from", options.resumeFrom},
                    {"restart_count", options.restartCount}});
  }

  bool end = false;
  try {
  for (int64_t epoch = firstEpoch; epoch <= tc.epochs && !end; ++epoch) {
    model.train();
    // A run resumed at its last step trains no more, but still evaluates.
    const bool done = loop.step >= plan.totalSteps;
    const bool first = epoch == firstEpoch;
    int64_t from = first && at.relaid ? at.from : 0;
    int64_t startBatch = first ? firstBatch : 0;
    if (done) {
      // Nothing left of the epoch: past its last batch, or past its order.
      startBatch = from > 0 ? 0 : plan.batchesPerEpoch;
      from = from > 0 ? datasets.train->size() : 0;
    }
    end = loop.runEpoch(epoch, startBatch, from) || done;
    loop.evaluateAfter(epoch, epoch == tc.epochs || end);
  }
  } catch (const Error& e) {
    holdAfterFailure(e, checkpoints, loop.step, resume ? resume->step : 0);
    throw;
  }

  monitor::setPhase(monitor::Phase::finishing);
  summary.steps = loop.step;
  summary.seconds = secondsSince(runStart);
  summary.nonfiniteSkipped = runner.skippedSteps();
  summary.lossScale = runner.lossScale();
  summary.checkpoints = checkpoints.finish();
  {
    // What this rank held; bench/zero-memory.sh reads every rank's line.
    const ddp::DdpStats ds = ddp.stats();
    auto& mem = summary.memory;
    mem.zeroStage = ds.zeroStage;
    mem.parameterBytes = ds.parameterElements * 4;
    mem.gradientBytes = ds.gradientElements * 4;
    mem.optimizerStateBytes = optimizerStateBytes(*optimizer);
    mem.largestUnitBytes = ds.largestUnitElements * 4;
    mem.unitPeakBytes = ds.unitPeakElements * 4;
    struct rusage usage {};
    const double peak = ::getrusage(RUSAGE_SELF, &usage) == 0 ? double(usage.ru_maxrss) / 1024.0 : 0.0;
    log::info("memory held: parameters {:.1f} MB, gradients {:.1f} MB, optimizer state {:.1f} MB "
              "(ZeRO stage {}); peak resident {:.0f} MB",
              double(mem.parameterBytes) / (1 << 20), double(mem.gradientBytes) / (1 << 20),
              double(mem.optimizerStateBytes) / (1 << 20), mem.zeroStage, peak);
    if (mem.zeroStage == 3) {
      log::info("ZeRO stage 3: at most {:.1f} MB of gathered units at once (parameters, full "
                "gradients, reduce-scatter buffers); the largest unit is {:.1f} MB",
                double(mem.unitPeakBytes) / (1 << 20), double(mem.largestUnitBytes) / (1 << 20));
    } else if (mem.zeroStage == 2 && comm.worldSize > 1) {
      log::info("ZeRO stage 2: at most {:.1f} MB of full gradients and reduce-scatter buffers at "
                "once, besides this rank's part",
                double(mem.unitPeakBytes) / (1 << 20));
    }
  }
  // A SIGTERM from here on changes nothing: this rank is finishing anyway.
  if (summary.stopped) return summary;
  finishTraining(job, comm, runDir, ddp, model, loop, summary);
  return summary;
}

}  // namespace cohort::train
