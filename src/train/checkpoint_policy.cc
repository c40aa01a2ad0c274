#include "train/detail/checkpoint_policy.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "cohort/ckpt/held_state.h"
#include "cohort/ckpt/rank_state.h"
#include "cohort/ckpt/resume.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tier.h"
#include "cohort/config/load.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/memory_limit.h"
#include "cohort/core/time.h"
#include "cohort/monitor/activity.h"
#include "cohort/monitor/profiler.h"
#include "cohort/monitor/timeline.h"
#include "cohort/security/keys.h"
#include "cohort/models/lora.h"
#include "cohort/storage/storage.h"

namespace cohort::train::detail {

CheckpointPolicy::CheckpointPolicy(const JobConfig& job, const parallel::Plan& plan,
                                   const RunDir& runDir, torch::optim::Optimizer& optimizer,
                                   const std::vector<std::string>& paramNames,
                                   const StepPlan& steps, const MemoryShare& mem)
    : job_(job),
      rank_(plan.mesh().world.rank),
      world_(plan.mesh().world.worldSize),
      localRank_(plan.mesh().world.localRank),
      role_(plan.checkpointRole()),
      dataWorld_(plan.dataWorld()),
      heldDir_(env::elasticStateDir().value_or("")),
      epochPlan_(steps),
      stop_(plan.mesh().world, job.checkpoint.enabled || !heldDir_.empty()),
      arch_(choiceName(job.model.arch)),
      sharded_(job.distribution.zero > 0),
      jobHash_(jobHash(job)),
      optimizerCache_(optimizer, paramNames) {
  const comm::Comm& comm = plan.mesh().world;
  {
    // A node's ranks are consecutive (RANK = node rank x procs + local
    // rank): the first replica with a rank on this node in this rank's
    // stage and slice holds their files for the node.
    const parallel::Mesh& mesh = plan.mesh();
    const int first = rank_ - localRank_, end = first + comm.localWorldSize;
    for (int r = 0; r < mesh.replicas; ++r) {
      const int j = mesh.jobRank(r, mesh.stage, mesh.tensorRank);
      if (j >= first && j < end) {
        holdsShared_ = j == rank_;
        break;
      }
    }
  }
  const models::Model& model = plan.model();
  const CheckpointConfig& cc = job.checkpoint;
  manifestExtra_ = {{"job", toYaml(job)}};
  std::set<const void*> buffers;
  for (const auto& b : model.buffers()) buffers.insert(b.unsafeGetTensorImpl());
  // With model.lora only the adapters (and buffers): the frozen weights
  // are model.init_from's, whose digest the manifest records.
  for (auto& [name, t] : models::trainedState(model)) {
    modelItems_.push_back({name, t, buffers.count(t.unsafeGetTensorImpl()) > 0});
  }
  modelList_ = std::make_shared<const std::vector<ckpt::SnapshotItem>>(modelItems_);
  if (!cc.enabled) return;
  ckpt::CheckpointerOptions co;
  co.dir = ckpt::checkpointDir(job, runDir);
  co.rank = rank_;
  co.worldSize = world_;
  co.maxInFlight = std::max<int>(1, static_cast<int>(cc.maxInFlight));
  co.whenBehind = cc.whenBehind;
  co.onError = cc.onError;
  co.keepLast = cc.keepLast;
  co.keepEvery = cc.keepEverySteps;
  co.timeout = comm.timeout;
  if (world_ > 1) co.store = comm::openStoreClient(comm);
  if (rank_ == 0 && !cc.remote.empty()) {
    co.remote = ckpt::openTier(ckpt::remoteCheckpointDir(job, runDir),
                               storage::storageOptions(job.storage));
  }
  if (auto p = env::checkpointPause()) {
    co.pauseAtStep = p->step;
    co.pauseSeconds = p->seconds;
  }
  co.manifestExtra = manifestExtra_;
  if (const security::Keyring* keys = security::installedKeyring()) {
    co.sealWith = keys->current;
    co.manifestExtra["encryption"] = {{"algorithm", "AES-256-GCM"}, {"key_id", keys->current.id}};
  }
  // What one snapshot copies: the model (the stage's data rank 0; at ZeRO
  // stage 3 all but the trainable parameters, of which every rank writes
  // its parts), and optimizer state of about one (sgd) or two (adamw)
  // copies of what the optimizer steps (with ZeRO, this rank's part), plus
  // room for headers and alignment.
  uint64_t bytes = 0;
  if (role_.writesShared || sharded_) {
    const bool partsOfParameters = job.distribution.zero == 3;
    uint64_t params = 0;
    if (role_.writesShared) {
      for (const auto& [n, t] : models::trainedState(model)) {
        if (!(partsOfParameters && t.requires_grad())) bytes += t.nbytes();
      }
    }
    for (auto& group : optimizer.param_groups()) {
      for (const auto& p : group.params()) params += p.nbytes();
    }
    const uint64_t copies =
        (job.training.optimizer.name == OptimizerKind::adamw ? 2 : 1) + (partsOfParameters ? 1 : 0);
    bytes += params * copies + (uint64_t{8} << 20);
  }
  // In place when the copies would leave less than 40% of the rank's
  // share for activations and transient buffers: what the process holds
  // now, the optimizer state its first step allocates, and the copies.
  co.inPlace = cc.maxInFlight == 0;
  const double share = mem.bytes();
  uint64_t stepped = 0;  // elements the optimizer steps; its state is allocated at its first step
  for (auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) stepped += p.nbytes();
  }
  const double pendingState = optimizer.state().empty()
      ? double(stepped) * (job.training.optimizer.name == OptimizerKind::adamw ? 2 : 1) : 0.0;
  const double projected = double(memory::residentBytes()) + pendingState;
  if (!co.inPlace && share > 0 && projected + double(bytes) * double(co.maxInFlight) > 0.6 * share) {
    co.inPlace = true;
    log::info("checkpoints are written in place (no host copy): a copy of {:.0f} MB beside the {:.0f} MB "
              "this rank holds with its optimizer state would leave less than 40% of its {:.0f} MB "
              "({}); the optimizer step after a checkpoint waits for its write",
              double(bytes) / (1 << 20), projected / (1 << 20), share / (1 << 20), mem.describe());
  }

  checkpointer_ = std::make_unique<ckpt::Checkpointer>(co);
  if (bytes > 0 && !co.inPlace) checkpointer_->reserve(bytes);
}

void CheckpointPolicy::writeParametersInParts(const parallel::Plan& plan) {
  const std::vector<std::string> held = plan.parametersInParts();
  const std::set<std::string> inParts(held.begin(), held.end());
  nlohmann::json order = nlohmann::json::array();
  std::vector<ckpt::SnapshotItem> rest;
  for (const ckpt::SnapshotItem& item : modelItems_) {
    order.push_back(item.name);
    if (inParts.count(item.name) == 0) rest.push_back(item);
  }
  modelList_ = std::make_shared<const std::vector<ckpt::SnapshotItem>>(std::move(rest));
  // The tensors the optimizer steps: the step waits for their copy.
  std::vector<ckpt::SnapshotItem> parts;
  const std::vector<at::Tensor> tensors = plan.optimizerParameters();
  for (size_t k = 0; k < tensors.size(); ++k) {
    parts.push_back({fmt::format("part{}", k), tensors[k].detach(), false});
  }
  partList_ = std::make_shared<const std::vector<ckpt::SnapshotItem>>(std::move(parts));
  zero_["model_parts"] = true;
  zero_["model_order"] = std::move(order);
}

ckpt::Manifest CheckpointPolicy::manifestAt(int64_t step, int64_t epoch, int64_t micro,
                                            double lr) const {
  ckpt::Manifest m;
  m.step = step;
  m.epoch = epoch;
  m.batchInEpoch = micro;
  // Positions of the epoch's order consumed by all ranks (StepPlan,
  // DistributedSampler): a resume on any world size or batch size goes on
  // from there (train/detail/setup.h, resumePosition).
  m.samplesInEpoch =
      epochFrom_ + std::min(epochPlan_.perRank, micro * epochPlan_.batchSize) * dataWorld_;
  m.worldSize = world_;
  m.jobHash = jobHash_;
  m.extra = {{"lr", lr},
             {"optimizer", std::string(choiceName(job_.training.optimizer.name))},
             {"peak_lr", epochPlan_.peakLr},
             {"global_batch", epochPlan_.globalBatch},
             {"batch_size", epochPlan_.batchSize},
             {"accumulate", epochPlan_.accumulate},
             {"epoch_start", epochFrom_},
             {"epoch_done", micro == epochPlan_.batchesPerEpoch}};
  if (!loraBaseDigest_.empty()) m.extra["lora_base_digest"] = loraBaseDigest_;
  if (scaler_) {
    const LossScaler::State s = scaler_->state();
    m.extra["loss_scale"] = {{"scale", s.scale}, {"good_steps", s.goodSteps}};
  }
  if (!tensor_.is_null()) m.extra["tensor"] = tensor_;
  if (!pipeline_.is_null()) {
    m.extra["pipeline"] = pipeline_;
  } else if (!zero_.is_null()) {
    m.extra["zero"] = zero_;
  }
  return m;
}

std::vector<ckpt::SnapshotFile> CheckpointPolicy::filesOf(bool writesShared) {
  const std::string optimizerName(choiceName(job_.training.optimizer.name));
  std::vector<ckpt::SnapshotFile> files;
  // The lists of live tensors are built once (again only when the
  // optimizer's set of states changes): marking costs no copy of them.
  auto named = [&](const std::string& name) { return role_.file(name); };
  if (writesShared) {
    files.emplace_back(named("model.bin"), modelList_,
                       nlohmann::json{{"kind", "model"}, {"arch", arch_}});
  }
  if (partList_) {
    files.emplace_back(named(ckpt::modelPartFile(role_.dataRank)), partList_,
                       nlohmann::json{{"kind", "model parts"}, {"rank", role_.dataRank}});
  }
  if (writesShared || sharded_) {
    const auto& state = optimizerCache_.get();
    if (!optimizerList_ || optimizerCache_.generation() != optimizerGeneration_) {
      std::vector<ckpt::SnapshotItem> items;
      for (const auto& [name, t] : state) items.push_back({name, t, false});
      optimizerList_ = std::make_shared<const std::vector<ckpt::SnapshotItem>>(std::move(items));
      optimizerGeneration_ = optimizerCache_.generation();
    }
    // ZeRO: every rank writes the state of its parts (ckpt::optimizerFile).
    files.emplace_back(named(ckpt::optimizerFile(sharded_, role_.dataRank)), optimizerList_,
                       nlohmann::json{{"kind", "optimizer"}, {"name", optimizerName}, {"rank", role_.dataRank}});
  }
  // Buffers differ per rank when they are not broadcast.
  files.emplace_back(ckpt::rankStateFile(rank_),
                     ckpt::rankStateItems(modelItems_, !job_.distribution.broadcastBuffers),
                     nlohmann::json{{"kind", "rank"}, {"rank", rank_}});
  return files;
}

bool CheckpointPolicy::take(int64_t step, int64_t epoch, int64_t micro, double lr,
                            Reporter& reporter) {
  const auto since = SteadyClock::now();
  monitor::setPhase(monitor::Phase::checkpoint);
  monitor::TimelineSpan span("checkpoint (training blocked)", "checkpoint");
  monitor::ProfileRange range("checkpoint");
  const bool taken =
      checkpointer_->mark(manifestAt(step, epoch, micro, lr), filesOf(role_.writesShared), since);
  reporter.board(step, {{"checkpoint/blocked_ms", 1000 * secondsSince(since)}});
  return taken;
}

void CheckpointPolicy::hold(int64_t step, int64_t epoch, int64_t micro, double lr) {
  const auto since = SteadyClock::now();
  monitor::setPhase(monitor::Phase::checkpoint);
  monitor::TimelineSpan span("state held in memory", "checkpoint");
  ckpt::Manifest m = manifestAt(step, epoch, micro, lr);
  for (const auto& [key, value] : manifestExtra_.items()) m.extra[key] = value;
  // The round that trained the step (a held step is always one of this
  // round's): the same step held from two rounds is two histories, when a
  // round went back to an older checkpoint (elastic/held_state.h).
  m.extra["round"] = env::restartCount();
  // Every node keeps what a checkpoint's first replica writes: the lowest
  // of the node's ranks of each stage and slice writes it into the node's
  // directory.
  ckpt::writeHeldState(heldDir_, std::move(m), filesOf(holdsShared_), rank_);
  // Older steps are of no more use once this one is written.
  if (localRank_ == 0) ckpt::pruneHeldState(heldDir_, step);
  log::info("state of step {} held in {} ({:.0f} ms)", step, heldDir_, 1000 * secondsSince(since));
}

bool CheckpointPolicy::afterStep(int64_t step, int64_t epoch, int64_t micro, double lr,
                                 Reporter& reporter) {
  const CheckpointConfig& cc = job_.checkpoint;
  if (checkpointer_) checkpointer_->poll();
  const bool endOfEpoch = micro == epochPlan_.batchesPerEpoch;
  const bool due = checkpointer_ && ((cc.everySteps > 0 && step % cc.everySteps == 0) ||
                                     (endOfEpoch && cc.everyEpochs > 0 && epoch % cc.everyEpochs == 0));
  if (!stop_.due(step)) {
    if (due) take(step, epoch, micro, lr, reporter);
    return false;
  }
  if (stop_.reform() && !heldDir_.empty()) {
    if (checkpointer_) checkpointer_->flush();
    hold(step, epoch, micro, lr);
    // With ZeRO a node that leaves takes its parts of the state along: the
    // re-form also writes them to the checkpoint directory.
    if (sharded_ && checkpointer_) {
      take(step, epoch, micro, lr, reporter);
      checkpointer_->flush();
    }
    reformed_ = true;
    log::info("stopped after step {} for a re-form (epoch {}, batch {})", step, epoch, micro);
    return true;
  }
  if (!checkpointer_) return false;
  // The last checkpoint is never skipped: a buffer is free once the earlier
  // ones are written. It is durable when flush returns.
  checkpointer_->flush();
  take(step, epoch, micro, lr, reporter);
  checkpointer_->flush();
  if (checkpointer_->lastWrittenStep() != step) {
    throw IoError(fmt::format(
        "rank {}: stopping on request, but the checkpoint of step {} could not be written (see "
        "the warning above); a rerun resumes from the previous one",
        rank_, step));
  }
  log::warn("stopped on request after step {} (epoch {}, batch {}); checkpoint written: rerun "
            "the same command to resume",
            step, epoch, micro);
  return true;
}

void CheckpointPolicy::markBoundary(int64_t step, int64_t epoch, int64_t micro, double lr) {
  boundary_ = {step, epoch, micro, lr, epochFrom_, epochPlan_};
}

int64_t CheckpointPolicy::holdLastBoundary(int64_t since) {
  if (heldDir_.empty() || boundary_.step <= since) return -1;
  // The epoch the boundary belongs to (the next one may have begun).
  epochFrom_ = boundary_.epochFrom;
  epochPlan_ = boundary_.plan;
  hold(boundary_.step, boundary_.epoch, boundary_.micro, boundary_.lr);
  return boundary_.step;
}

ckpt::CheckpointStats CheckpointPolicy::finish() {
  if (!checkpointer_) return {};
  checkpointer_->flush();
  const ckpt::CheckpointStats s = checkpointer_->stats();
  const int64_t marks = s.taken + s.skipped;
  log::info("checkpoints: {} taken, {} skipped, {} failed; training blocked {:.3f} ms per "
            "checkpoint on average, {:.3f} ms at most",
            s.taken, s.skipped, s.failed, marks > 0 ? 1000 * s.blockedSeconds / double(marks) : 0.0,
            1000 * s.maxBlockedSeconds);
  return s;
}

}  // namespace cohort::train::detail
