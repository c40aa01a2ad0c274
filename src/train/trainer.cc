#include "cohort/train/trainer.h"

// The path of one rank (docs/architecture.md, "The path of one step"):
//
//   train()      setUp and resume (state.h, state.cc), runEpochs, finish,
//                over one TrainState
//   runEpoch     one epoch of steps: StepRunner (step.h) for the step
//                itself, Reporter (reporting.h) for records, CheckpointPolicy
//                (checkpoint_policy.h) for checkpoints and the stop protocol;
//                evaluation (evaluate.h) after the epochs that ask for it

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>
#include <optional>
#include <set>

#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/weights.h"
#include "cohort/comm/wait.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/exit_codes.h"
#include "cohort/core/fence.h"
#include "cohort/core/log.h"
#include "cohort/core/memory_limit.h"
#include "cohort/core/time.h"
#include "cohort/models/lora.h"
#include "cohort/models/model.h"
#include "cohort/monitor/activity.h"
#include "cohort/monitor/profiler.h"
#include "cohort/monitor/timeline.h"
#include "cohort/parallel/pipeline.h"
#include "cohort/train/optimizer.h"
#include "train/detail/evaluate.h"
#include "train/detail/memory_fit.h"
#include "train/detail/stages.h"
#include "train/detail/state.h"

namespace cohort::train {
namespace {

using namespace detail;

// Trains `epoch` from its micro-batch `startBatch`, the epoch taken up at
// position `from` of its order (a resume in another layout; 0: from its
// start). Returns true when training ends with it: the last step is done,
// or a stop request was served (summary.stopped).
bool runEpoch(TrainState& s, int64_t epoch, int64_t startBatch, int64_t from) {
  const JobConfig& job = s.job;
  const StepPlan& plan = s.steps;
  Loaders& loaders = s.loaders;
  CheckpointPolicy& checkpoints = *s.checkpoints;
  SampleLog& samples = *s.samples;
  Reporter& reporter = *s.reporter;
  StepRunner& runner = *s.runner;
  TrainSummary& summary = s.summary;
  int64_t& step = s.step;
  data::BatchLoader& loader = *loaders.train;
  const data::DistributedSampler& sampler = *loaders.trainSampler;
  const StepPlan ep = from > 0 ? plan.takenUpWith(sampler.sharedSamplesPerRank(from),
                                                  sampler.samplesPerRank(from))
                               : plan;
  checkpoints.startEpoch(from, ep);
  std::vector<int64_t> order = loaders.trainSampler->indices(epoch - 1, from);
  if (samples.enabled()) samples.startEpoch(order, ep.batchSize);
  loader.startEpoch(std::move(order), epoch, startBatch, sampler.sharedSamplesPerRank(from));
  reporter.startEpoch(epoch, std::min(ep.stepsPerEpoch - startBatch / ep.accumulate,
                                      plan.totalSteps - step));
  bool end = false;
  // A step's micro-batches run in rounds of the plan's size (1; a
  // pipeline's micro_batches): the round's batches are taken first.
  const size_t roundSize = static_cast<size_t>(s.plan->roundSize());
  std::vector<data::Batch> round;
  int64_t roundStart = startBatch;
  for (int64_t micro = startBatch;;) {
    if (s.profiler) s.profiler->beforeStep(step + 1);
    monitor::setPhase(monitor::Phase::data);
    auto batch = [&] {
      monitor::TimelineSpan span("data wait", "data");
      monitor::ProfileRange range("data");
      return loader.next();
    }();
    if (!batch && round.empty()) break;
    const Cycle cycle = ep.cycleOf(batch ? micro : micro - 1);
    if (batch) {
      if (samples.enabled()) samples.microBatch(step + 1, epoch, batch->index, batch->labels.size(0));
      round.push_back(std::move(*batch));
      ++micro;
      if (round.size() < roundSize && !cycle.last) continue;
    }
    const std::vector<double> losses = runner.round(round, cycle, roundStart, step);
    for (size_t k = 0; k < round.size(); ++k) {
      reporter.microBatch(losses[k], round[k].labels.size(0), round[k].skipped);
      summary.corruptSkipped += round[k].skipped;
    }
    round.clear();
    roundStart = micro;
    if (!batch) break;
    if (!cycle.last) continue;

    const double lr = s.schedule->at(step);
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
    s.faults.afterStep(step);
    reporter.stepDone(step, epoch, lr);
    if (checkpoints.afterStep(step, epoch, micro, lr, reporter)) {
      summary.stopped = true;
      summary.reformed = checkpoints.reformed();
    }
    if (s.profiler) s.profiler->afterStep(step);
    if (summary.stopped || step >= plan.totalSteps) {
      end = true;
      break;
    }
  }

  const EpochTotals t = reporter.endEpoch();
  // Every rank of a replica trains on the same samples: count them once.
  const int world = s.mesh.replicas;
  s.trainSeconds += t.seconds;
  s.waitSeconds += t.waitSeconds;
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
  if (const std::string io = s.datasets.train->ioSummary(); !io.empty()) {
    log::info("training data after epoch {}: {}", epoch, io);
  }
  return end;
}

// Evaluates after `epoch` when data.eval is set and training.eval_every
// asks for it, or `last`.
void evaluateAfter(TrainState& s, int64_t epoch, bool last) {
  TrainSummary& summary = s.summary;
  const int64_t every = s.job.training.evalEvery;
  Loaders& loaders = s.loaders;
  const bool due = every > 0 && epoch % every == 0;
  if (!loaders.eval || !(due || last) || summary.stopped) return;
  monitor::setPhase(monitor::Phase::evaluation);
  monitor::TimelineSpan span("evaluation", "eval");
  s.plan->syncBuffers();
  const auto start = SteadyClock::now();
  monitor::EvalRecord r =
      evaluate(*s.plan, *loaders.eval, *loaders.evalSampler, s.runner->precision());
  r.step = s.step;
  r.epoch = epoch;
  r.seconds = secondsSince(start);
  // Masked language modelling predicts 15% of the tokens from both sides:
  // its loss is no code length of the text.
  const double perToken = s.datasets.eval && !maskedLm(s.job) ? s.datasets.eval->bytesPerToken() : 0;
  if (r.tokens > 0 && perToken > 0) {
    r.lossPerByte = r.loss / perToken;
    r.bitsPerByte = r.lossPerByte / std::log(2.0);
  }
  s.reporter->evaluation(r);
  summary.evaluated = true;
  summary.lastEval = r;
  summary.bestTop1 = std::max(summary.bestTop1, r.top1);
  if (r.tokens > 0) {
    if (maskedLm(s.job)) {
      log::info("eval after epoch {}: loss {:.4f}, masked-token top-1 {:.4f} ({} masked tokens, {:.1f} s)", epoch,
                r.loss, r.top1, r.tokens, r.seconds);
    } else {
      log::info("eval after epoch {}: loss {:.4f}, perplexity {:.3f}, {:.4f} bits per byte, next-token top-1 "
                "{:.4f} ({} tokens, {:.1f} s)",
                epoch, r.loss, r.perplexity, r.bitsPerByte, r.top1, r.tokens, r.seconds);
    }
  } else {
    log::info("eval after epoch {}: top-1 {:.4f}, top-5 {:.4f}, loss {:.4f} ({} {}, {:.1f} s)", epoch, r.top1, r.top5,
              r.loss, r.samples, textClassifier(s.job) ? "texts" : "images", r.seconds);
  }
  s.plan->model().train();
}

// The summary's memory figures: what this rank held (bench/zero-memory.sh
// reads every rank's line).
double recordMemory(TrainState& s) {
  const parallel::DdpStats ds = s.plan->stats();
  auto& mem = s.summary.memory;
  mem.zeroStage = ds.zeroStage;
  mem.parameterBytes = ds.parameterElements * 4;
  mem.gradientBytes = ds.gradientElements * 4;
  mem.optimizerStateBytes = optimizerStateBytes(*s.optimizer);
  mem.largestUnitBytes = ds.largestUnitElements * 4;
  mem.unitPeakBytes = ds.unitPeakElements * 4;
  mem.frozenBytes = ds.frozenElements * 4;
  if (!s.mesh.pipelined() && mem.zeroStage < 3) {
    const models::Model& model = s.plan->model();
    mem.elements = detail::countElements(model, model.shardingUnits());
    mem.elementsKnown = true;
  }
  const double peak = memory::peakResidentMb();
  log::info("memory held: parameters {:.1f} MB, gradients {:.1f} MB, optimizer state {:.1f} MB "
            "(ZeRO stage {}); peak resident {:.0f} MB",
            double(mem.parameterBytes) / (1 << 20), double(mem.gradientBytes) / (1 << 20),
            double(mem.optimizerStateBytes) / (1 << 20), mem.zeroStage, peak);
  if (mem.zeroStage == 3) {
    log::info("ZeRO stage 3: at most {:.1f} MB of gathered units at once (parameters, full "
              "gradients, reduce-scatter buffers); the largest unit is {:.1f} MB{}",
              double(mem.unitPeakBytes) / (1 << 20), double(mem.largestUnitBytes) / (1 << 20),
              mem.frozenBytes > 0 ? fmt::format("; this rank's parts of the frozen base {:.1f} MB",
                                                double(mem.frozenBytes) / (1 << 20))
                                  : std::string());
  } else if (mem.zeroStage == 2 && s.mesh.replicas > 1) {
    log::info("ZeRO stage 2: at most {:.1f} MB of full gradients and reduce-scatter buffers at "
              "once, besides this rank's part",
              double(mem.unitPeakBytes) / (1 << 20));
  }
  return peak;
}

// A pipeline: each stage's figures in its log, and every stage's of replica
// 0 in rank 0's summary. Collective over the job.
void recordStages(TrainState& s, double peakMb) {
  if (!s.mesh.pipelined()) return;
  const auto& pipe = static_cast<const parallel::Pipeline&>(*s.plan);
  const parallel::PipelineStats st = pipe.stats();
  const auto& mem = s.summary.memory;
  const models::ModelPart part = partOf(s.split, s.mesh.stage);
  const double bubble = parallel::bubbleFraction(st.stages, st.microBatches);
  log::info("pipeline: {}: idle {:.1f}% of its rounds (the schedule's theory: {:.1f}% for {} stages "
            "and {} micro-batches): {:.2f} s blocked receiving, {:.2f} s waiting at rounds' ends; "
            "{:.2f} s sending; activations of up to {} micro-batches held at once",
            s.mesh.describe(), 100 * st.idleFraction(), 100 * bubble, st.stages, st.microBatches,
            st.recvSeconds, st.endSeconds, st.sendSeconds, st.heldPeak);
  constexpr int kFields = 12;
  const int stages = s.mesh.stages;
  at::Tensor all = torch::zeros({stages * kFields}, torch::kFloat64);
  if (s.mesh.replica == 0) {
    const double v[kFields] = {double(part.firstBlock), double(part.endBlock), double(s.model.parameters),
                               double(mem.parameterBytes + mem.gradientBytes + mem.optimizerStateBytes +
                                      8 * pipe.tiedElements()),
                               peakMb, st.idleFraction(), bubble, st.recvSeconds, st.sendSeconds,
                               st.roundSeconds, double(st.heldPeak), st.endSeconds};
    auto a = all.accessor<double, 1>();
    for (int k = 0; k < kFields; ++k) a[s.mesh.stage * kFields + k] = v[k];
  }
  comm::allreduceSum(s.comm, all, "pipeline stage figures");
  if (s.comm.rank != 0) return;
  auto a = all.accessor<double, 1>();
  TrainSummary& summary = s.summary;
  summary.schedule = std::string(choiceName(s.job.distribution.pipeline.schedule));
  summary.microBatches = st.microBatches;
  for (int k = 0; k < stages; ++k) {
    auto at = [&](int f) { return a[k * kFields + f]; };
    TrainSummary::Stage x;
    x.firstBlock = static_cast<int64_t>(at(0));
    x.endBlock = static_cast<int64_t>(at(1));
    x.parameters = static_cast<int64_t>(at(2));
    x.stateBytes = static_cast<int64_t>(at(3));
    x.peakResidentMb = at(4);
    x.idleFraction = at(5);
    x.bubbleFraction = at(6);
    x.recvSeconds = at(7);
    x.sendSeconds = at(8);
    x.roundSeconds = at(9);
    x.heldPeak = static_cast<int64_t>(at(10));
    x.endSeconds = at(11);
    summary.stages.push_back(x);
  }
}

// model/final.pt at ZeRO stage 3 without a pipeline: rank 0 gathers one
// unit at a time and writes it before the next (writeByUnit), so no
// process holds the model.
void saveFinalByUnit(TrainState& s) {
  parallel::UnitWrite all;
  all.keep = [](const std::string&) { return true; };
  all.value = [](const std::string&, const at::Tensor& t) { return t; };
  const std::string path = finalModelPath(s.job, s.runDir);
  const double peak = s.plan->writeByUnit(path, s.job.output.weightsFormat, finalModelKey(s.job), all);
  if (s.comm.rank == 0) {
    log::info("saved {} (one unit at a time); peak resident {:.0f} MB", path, peak);
  }
}

// With model.lora at ZeRO stage 3 (the base held in parts): model/final.pt
// with each adapter merged into its layer's weight, as mergedStateDict,
// one unit at a time: a unit's adapters and frozen weights are gathered
// together.
void saveMergedByUnit(TrainState& s) {
  const models::Model& model = s.plan->model();
  std::map<std::string, std::shared_ptr<models::AdaptableLinearImpl>> adapted;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    auto l = std::dynamic_pointer_cast<models::AdaptableLinearImpl>(m.value());
    if (l && l->adapted()) adapted.emplace(m.key() + ".weight", l);
  }
  parallel::UnitWrite merged;
  merged.keep = [](const std::string& name) { return !models::isAdapterName(name); };
  merged.value = [&](const std::string& name, const at::Tensor& t) {
    auto it = adapted.find(name);
    return it == adapted.end() ? t : it->second->mergedWeight();
  };
  const std::string path = finalModelPath(s.job, s.runDir);
  const double peak = s.plan->writeByUnit(path, s.job.output.weightsFormat, finalModelKey(s.job), merged);
  if (s.comm.rank == 0) {
    log::info("saved {} (adapters merged, one unit at a time); peak resident {:.0f} MB", path, peak);
  }
}

// model/final.pt (rank 0): the whole model, or with model.lora the
// adapters (and, on request, the merged model).
void saveFinalModel(TrainState& s) {
  fence::check("the final model");
  const JobConfig& job = s.job;
  parallel::Plan& plan = *s.plan;
  const RunDir& runDir = s.runDir;
  plan.syncBuffers();  // the saved BatchNorm statistics are rank 0's, as during training
  if (s.model.units && !s.mesh.pipelined()) {
    saveFinalByUnit(s);
    return;
  }
  // ZeRO stage 3: the parameters are gathered on rank 0 for the save.
  plan.gatherForSave();
  const security::Key* key = finalModelKey(job);
  if (models::hasAdapters(plan.model())) {
    if (s.comm.rank == 0) s.summary.loraBaseDigest = s.model.frozenDigest;  // the base never trains
    const ckpt::StateDict adapters = plan.collect(models::adapterStateDict);
    if (s.comm.rank == 0) {
      ckpt::saveStateDict(adapters, runDir.adapters(), key);
      log::info("saved {}", runDir.adapters());
    }
    if (job.output.mergeLora && s.model.frozenUnits) {
      plan.releaseParameters();
      saveMergedByUnit(s);
    } else if (job.output.mergeLora) {
      const ckpt::StateDict merged = plan.collect(models::mergedStateDict);
      if (s.comm.rank == 0) {
        ckpt::saveWeights(merged, finalModelPath(job, runDir), job.output.weightsFormat, key);
        log::info("saved {} (adapters merged)", finalModelPath(job, runDir));
      }
    }
  } else {
    // Written as the tensors arrive: rank 0 holds its own part and one
    // tensor of another stage, never a second copy of the model.
    std::unique_ptr<ckpt::WeightsWriter> out;
    if (s.comm.rank == 0) out = ckpt::openWeightsWriter(finalModelPath(job, runDir), job.output.weightsFormat, key);
    std::map<std::string, std::string> tied;
    for (const auto& [name, of] : plan.model().tiedNames()) tied.emplace(name, of);
    plan.visitCollected(models::publishedStateDict, [&](const std::string& name, const at::Tensor& t) {
      // A tied second name arrives as its own tensor; in a format without
      // shared tensors (safetensors) it is a name only.
      auto it = tied.find(name);
      if (it != tied.end() && job.output.weightsFormat == WeightsFormat::safetensors) {
        out->alias(name, it->second);
      } else {
        out->add(name, t);
      }
    });
    if (out) {
      out->finish();
      log::info("saved {}", finalModelPath(job, runDir));
    }
  }
  plan.releaseParameters();
}

// A tensor split's exchanges per step, against Megatron's count for the
// blocks: 4 sums of [batch, block_size, n_embd] per block and micro-batch
// (one after attention and one after the MLP, forward and backward), in
// the precision the sums carry. The rest (the embedding's sum, the head's
// input gradient, the cross-entropy's three sums of one value per token)
// is what the measured count has beyond it.
void recordSplit(TrainState& s) {
  nlohmann::json t = s.plan->splitStats();
  if (t.is_null()) return;  // a pipeline of split stages counts no exchanges yet
  const int64_t steps = std::max<int64_t>(1, s.step - std::max<int64_t>(0, s.summary.resumedFromStep));
  const ModelConfig& m = s.job.model;
  const int64_t width = s.model.precision == Precision::bf16 ? 2 : 4;
  const int64_t micro = s.job.training.accumulateSteps;
  t["steps"] = steps;
  t["sum_bytes_per_step"] = t["sum_bytes"].get<int64_t>() / steps;
  t["gather_bytes_per_step"] = t["gather_bytes"].get<int64_t>() / steps;
  t["sums_per_step"] = t["sums"].get<int64_t>() / steps;
  t["block_sum_bytes_per_step_expected"] =
      4 * m.nLayer * s.job.training.batchSize * m.blockSize * m.nEmbd * width * micro;
  log::info("tensor split: {} sums of {:.2f} MB and {} all-gathers of {:.2f} MB per step (the blocks' 4 sums "
            "of batch x block_size x n_embd each: {:.2f} MB)",
            t["sums_per_step"].get<int64_t>(), t["sum_bytes_per_step"].get<int64_t>() / 1e6,
            t["gathers"].get<int64_t>() / steps, t["gather_bytes_per_step"].get<int64_t>() / 1e6,
            t["block_sum_bytes_per_step_expected"].get<int64_t>() / 1e6);
  s.summary.tensor = std::move(t);
}

// After the last epoch: the summary's figures and, unless training stopped
// on request, the exchange's counts, the data wait over all ranks, and
// model/final.pt.
TrainSummary finish(TrainState& s, SteadyClock::time_point runStart) {
  monitor::setPhase(monitor::Phase::finishing);
  if (s.profiler) s.profiler->finish();
  TrainSummary& summary = s.summary;
  summary.steps = s.step;
  summary.seconds = secondsSince(runStart);
  summary.nonfiniteSkipped = s.runner->skippedSteps();
  summary.recomputedForwards = models::recomputations();
  summary.lossScale = s.runner->lossScale();
  summary.checkpoints = s.checkpoints->finish();
  recordStages(s, recordMemory(s));
  // A SIGTERM from here on changes nothing: this rank is finishing anyway.
  if (summary.stopped) return summary;
  env::pauseForTest("final");
  const parallel::DdpStats ds = s.plan->stats();
  // A bucket is handed over when it is full: Gloo's allreduce starts, or
  // (one machine) the shared-memory segment learns it may be summed.
  log::info("gradient exchanges: {}; buckets handed to the exchange during backward: {}, after it: {}; "
            "path: {}",
            ds.syncs, ds.launchedDuringBackward, ds.launchedAtFinish, parallel::exchangeName(ds.exchange));
  summary.imagesPerS = s.trainSeconds > 0 ? double(summary.images) / s.trainSeconds : 0;
  at::Tensor waits = torch::tensor(
      {s.trainSeconds > 0 ? s.waitSeconds / s.trainSeconds : 0.0, double(summary.corruptSkipped)},
      torch::kFloat64);
  comm::allreduceSum(s.comm, waits, "data wait summary");
  summary.dataWaitFrac = waits[0].item<double>() / s.comm.worldSize;
  summary.corruptSkipped = static_cast<int64_t>(waits[1].item<double>());
  if (s.mesh.tensorSplit()) recordSplit(s);
  if (s.job.output.saveFinal) saveFinalModel(s);
  // Every rank's peak resident memory, final save included (summary.json).
  at::Tensor peaks = torch::zeros({s.comm.worldSize}, torch::kFloat64);
  peaks[s.comm.rank] = memory::peakResidentMb();
  comm::allreduceSum(s.comm, peaks, "peak resident memory per rank");
  if (s.comm.rank == 0) {
    summary.peakRssMbPerRank.clear();
    for (int r = 0; r < s.comm.worldSize; ++r) summary.peakRssMbPerRank.push_back(peaks[r].item<double>());
  }
  return summary;
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

// The epochs from where set-up and resume left off; each evaluated when it asks for it.
void runEpochs(TrainState& s) {
  const int64_t epochs = s.job.training.epochs;
  const int64_t firstEpoch = s.at.epoch;
  bool end = false;
  for (int64_t epoch = firstEpoch; epoch <= epochs && !end; ++epoch) {
    s.plan->model().train();
    // A run resumed at its last step trains no more, but still evaluates.
    const bool done = s.step >= s.steps.totalSteps;
    const bool first = epoch == firstEpoch;
    int64_t from = first && s.at.relaid ? s.at.from : 0;
    int64_t startBatch = first ? s.at.batch : 0;
    if (done) {
      // Nothing left of the epoch: past its last batch, or past its order.
      startBatch = from > 0 ? 0 : s.steps.batchesPerEpoch;
      from = from > 0 ? s.datasets.train->size() : 0;
    }
    end = runEpoch(s, epoch, startBatch, from) || done;
    evaluateAfter(s, epoch, epoch == epochs || end);
  }
}

}  // namespace

TrainSummary train(const JobConfig& job, const parallel::Mesh& mesh, const RunDir& runDir,
                   const TrainOptions& options) {
  TrainState s(job, mesh, runDir, options);
  setUp(s);
  resume(s);
  setUpProfiler(s);
  const auto runStart = SteadyClock::now();
  try {
    runEpochs(s);
  } catch (const Error& e) {
    holdAfterFailure(e, *s.checkpoints, s.step, s.resumed ? s.resumed->step : 0);
    throw;
  }
  return finish(s, runStart);
}

TrainSummary train(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir,
                   const TrainOptions& options) {
  const parallel::Mesh mesh = parallel::buildMesh(comm, meshShape(job));
  return train(job, mesh, runDir, options);
}

}  // namespace cohort::train
