#include "cohort/parallel/ddp.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <set>

#include "cohort/comm/shm.h"
#include "cohort/core/error.h"
#include "parallel/detail/exchange.h"
#include "parallel/detail/gloo_sum.h"
#include "parallel/detail/grad_copy.h"
#include "parallel/detail/unit_memory.h"
#include "cohort/comm/wait.h"
#include "cohort/monitor/timeline.h"
#include "cohort/core/log.h"

namespace cohort::parallel {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 comm::Comm comm, DdpOptions options)
    : module_(std::move(module)), comm_(std::move(comm)), options_(options) {
  COHORT_ASSERT(module_ != nullptr, "no module");
  std::set<const void*> seen;  // tied weights appear under several names: bucket them once
  for (const auto& p : module_->named_parameters()) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    const bool excluded = std::find(options_.exclude.begin(), options_.exclude.end(), p.key()) !=
                          options_.exclude.end();
    if (!p.value().requires_grad() || excluded) {
      if (!excluded && options_.zeroStage == 3 && options_.shardFrozen) {
        Param frozen;
        frozen.name = p.key();
        frozen.tensor = p.value();
        frozenParams_.push_back(std::move(frozen));
      } else {
        frozen_.push_back(p.value());
      }
      continue;
    }
    Param param;
    param.name = p.key();
    param.tensor = p.value();
    params_.push_back(std::move(param));
  }
  for (const auto& b : module_->named_buffers()) buffers_.push_back(b.value());

  COHORT_ASSERT(options_.zeroStage >= 0 && options_.zeroStage <= 3, "ZeRO stage ",
                options_.zeroStage);
  // Buckets in reverse registration order, split by dtype and device and by
  // the size cap (a parameter larger than the cap gets a bucket of its own);
  // at stage 3 one per sharding unit instead.
  if (options_.zeroStage == 3) bucketByUnit();
  const double capBytes = options_.bucketCapMb * 1024.0 * 1024.0;
  double bucketBytes = 0;
  for (size_t k = params_.size(); options_.zeroStage < 3 && k-- > 0;) {
    const at::Tensor& t = params_[k].tensor;
    const double bytes = static_cast<double>(t.numel()) * t.element_size();
    bool fresh = buckets_.empty();
    if (!fresh) {
      const Param& prev = params_[buckets_.back().params.back()];
      fresh = bucketBytes + bytes > capBytes || prev.tensor.scalar_type() != t.scalar_type() ||
              prev.tensor.device() != t.device();
    }
    if (fresh) {
      buckets_.emplace_back();
      bucketBytes = 0;
    }
    buckets_.back().params.push_back(k);
    params_[k].bucket = buckets_.size() - 1;
    bucketBytes += bytes;
  }

  stats_.zeroStage = options_.zeroStage;
  // ZeRO cuts every bucket into one part per rank: pad it to a multiple.
  const int64_t parts = options_.zeroStage > 0 ? comm_.worldSize : 1;
  torch::NoGradGuard noGrad;
  bool floatOnCpu = true;
  int64_t largest = 0;  // of the trainable buckets
  // Pads each of `list`'s buckets; returns their floats in all.
  auto pad = [&](std::vector<Bucket>& list, const std::vector<Param>& params, bool trainable) {
    int64_t all = 0;
    for (Bucket& b : list) {
      int64_t total = 0;
      for (size_t k : b.params) {
        const at::Tensor& t = params[k].tensor;
        floatOnCpu = floatOnCpu && t.scalar_type() == at::kFloat && t.device().is_cpu();
        total += t.numel();
      }
      b.padded = (total + parts - 1) / parts * parts;
      all += b.padded;
      if (trainable) largest = std::max(largest, b.padded);
    }
    return all;
  };
  totalFloats_ = pad(buckets_, params_, true);
  frozenFloats_ = pad(frozenBuckets_, frozenParams_, false);
  // With ZeRO on one machine the flat parameters are in the segment too,
  // so that the parts are gathered there. Stage 1: the gradients, then the
  // parameters. Stage 2: the parameters, then one bucket's staging area for
  // the reduce-scatter (the gradients are this rank's own, and freed once
  // exchanged). Stage 3: this rank's parts, then the staging area, then
  // its parts of the frozen parameters.
  setUpExchange(options_.zeroStage == 3   ? totalFloats_ / parts + largest + frozenFloats_ / parts
                : options_.zeroStage == 2 ? totalFloats_ + largest
                : options_.zeroStage == 1 ? 2 * totalFloats_
                                          : totalFloats_,
                floatOnCpu);
  const bool inShm = plan_->exchange == Exchange::sharedMemory;
  unitsInSharedMemory_ = options_.zeroStage == 3 && inShm;
  stagingInSharedMemory_ = options_.zeroStage >= 2 && inShm;
  shardedGradients_ = options_.zeroStage >= 2 && comm_.worldSize > 1;
  withoutBuckets_ = options_.zeroStage == 0 && comm_.worldSize == 1 && !shm_ && !options_.bucketsOnOneRank;
  stagingShmOffset_ = static_cast<size_t>(options_.zeroStage == 3 ? totalFloats_ / parts : totalFloats_);
  weightsShmOffset_ = options_.zeroStage == 2 ? 0 : static_cast<size_t>(totalFloats_);
  size_t shmOffset = 0;
  for (Bucket& b : buckets_) {
    const int64_t total = b.padded;
    // Where its gradients (stage 1), parameters (stages 1, 2) or part
    // (stage 3) are in the segment.
    b.shmOffset = shmOffset;
    shmOffset += static_cast<size_t>(unitsInSharedMemory_ ? total / parts : total);
    if (withoutBuckets_) continue;  // no flat buffer, no views: the gradients stay autograd's
    if (shm_ && options_.zeroStage < 2) {
      // A view of this rank's region; the deleter keeps the mapping alive
      // as long as any gradient tensor points into it.
      auto keep = shm_;
      b.flat = torch::from_blob(shm_->region() + b.shmOffset, {total},
                                [keep](void*) mutable { keep.reset(); },
                                params_[b.params.front()].tensor.options());
      b.flat.zero_();
    } else if (shardedGradients_) {
      // Allocated when the bucket's first gradient arrives (a hook on each
      // parameter; at stage 3 when the unit's backward begins) and freed
      // once exchanged; never touched before, so it holds no memory yet.
      b.flat = detail::unitBuffer(total, params_[b.params.front()].tensor.options());
    } else {
      b.flat = torch::zeros({total}, params_[b.params.front()].tensor.options());
    }
    int64_t offset = 0;
    for (size_t k : b.params) {
      Param& p = params_[k];
      const int64_t n = p.tensor.numel();
      // The view takes the parameter's strides when they are dense (e.g.
      // channels-last weights), so autograd accumulates without a relayout.
      at::Tensor slot = b.flat.narrow(0, offset, n);
      p.gradView = p.tensor.is_non_overlapping_and_dense()
                       ? slot.as_strided(p.tensor.sizes(), p.tensor.strides())
                       : slot.view(p.tensor.sizes());
      p.tensor.mutable_grad() = p.gradView;
      offset += n;
    }
  }
  stats_.gradientElements = totalFloats_;
  stats_.parameterElements = totalFloats_;
  if (options_.zeroStage > 0) setUpParts();
  if (shardedGradients_) {
    // Counted as allocated (and at stage 3 the parameters too) until
    // released: the gradients now, the parameters when broadcastState()
    // shards them; the staging area is held for good.
    int64_t cut = 0;  // parameters of parts cut beforehand: never held whole here
    for (const Bucket& b : buckets_) cut += b.preset != nullptr ? b.padded : 0;
    unitElements_ = totalFloats_ * (options_.zeroStage == 3 ? 2 : 1) - cut +
                    (stagingInSharedMemory_ ? largest : 0);
    for (size_t k = 0; k < buckets_.size(); ++k) releaseGradients(k);
    stats_.unitPeakElements = unitElements_;  // from here on: what training holds
    // Held between uses: this rank's part of the gradients (stage 3: and
    // of the parameters).
    stats_.gradientElements = totalFloats_ / comm_.worldSize;
    if (options_.zeroStage == 3) stats_.parameterElements = totalFloats_ / comm_.worldSize;
  } else if (options_.zeroStage == 3) {
    unitElements_ = totalFloats_;  // one rank: the parameters, until sharded
    for (const Bucket& b : buckets_) unitElements_ -= b.preset != nullptr ? b.padded : 0;
  }
  if (!frozenBuckets_.empty()) setUpFrozenParts(stagingShmOffset_ + static_cast<size_t>(largest));
  for (const at::Tensor& t : optimizerParameters()) stats_.optimizerElements += t.numel();

  // The accumulator of a leaf is held only weakly by the tensor: keep it
  // alive, or autograd would make a fresh one without our hook. Hooks point
  // at this object: if registering one fails, remove those already added.
  try {
    for (size_t k = 0; k < params_.size(); ++k) {
      Param& p = params_[k];
      p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
      COHORT_ASSERT(p.accumulator != nullptr, "no gradient accumulator for ", p.name);
      p.hookKey =
          p.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [this, k](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list&) {
                onGradReady(k);
                return outputs;
              }));
      if (shardedGradients_) {
        // Before autograd accumulates into the bucket: its storage exists.
        p.preHook = static_cast<int64_t>(p.tensor.register_hook([this, k](const at::Tensor&) {
          std::lock_guard<std::mutex> g(mutex_);
          allocateGradients(params_[k].bucket);
        }));
      }
    }
  } catch (...) {
    removeHooks();
    throw;
  }
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  std::lock_guard<std::mutex> g(mutex_);
  resetReadiness();
}

namespace {

int64_t micros(monitor::Timeline::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

monitor::Timeline::Clock::time_point timePoint(int64_t us) {
  return monitor::Timeline::Clock::time_point(std::chrono::microseconds(us));
}

std::string bucketArgs(const at::Tensor& flat, size_t params) {
  return fmt::format(R"({{"bytes":{},"parameters":{}}})", flat.nbytes(), params);
}

}  // namespace

void DistributedDataParallel::setUpExchange(int64_t totalFloats, bool floatOnCpu) {
  using Compression = DdpOptions::Compression;
  const bool sharded = options_.zeroStage >= 2;
  const char* why = !options_.sharedMemory ? "distribution.shared_memory is false"
                    : buckets_.empty()      ? "no trainable parameters"
                    : !floatOnCpu           ? "gradients are not all float32 on the CPU"
                                            : "ZeRO stages 2 and 3 have no hierarchical reduce-scatter";
  const bool shm = options_.sharedMemory && floatOnCpu && !buckets_.empty();
  plan_ = std::make_unique<detail::ExchangePlan>(
      detail::planExchange(comm_, shm, why, totalFloats, /*acrossMachines=*/!sharded));
  shm_ = plan_->shm;
  // The whole exchange in shared memory, every rank holding every sum: one
  // sum claimed in chunks after backward (comm/shm.h) instead of one per
  // bucket inside it, where the rank that got there first waited for the
  // others. The hierarchical exchange sums each bucket as it fills, for its
  // leader to send on at once; ZeRO stages 2 and 3 scatter the sums.
  claimedSum_ = shm_ != nullptr && plan_->exchange == Exchange::sharedMemory && !sharded;
  stats_.exchange = plan_->exchange;
  stats_.machines = plan_->machines;
  stats_.sharedMemory = shm_ != nullptr;
  if (options_.compression == Compression::none) return;
  const char* type = options_.compression == Compression::fp16 ? "fp16" : "bf16";
  switch (plan_->exchange) {
    case Exchange::none:
      break;
    case Exchange::sharedMemory:
      log::info("distribution.compression {} is ignored: gradients are summed in shared memory, "
                "not sent over Gloo", type);
      break;
    case Exchange::hierarchical:
      log::info("gradient compression: {} on the Gloo exchange between machines (shared memory "
                "within a machine stays float32)", type);
      break;
    case Exchange::gloo:
      log::info("gradient compression: {} on the Gloo exchange{}", type,
                options_.compression == Compression::bf16 ? " (an allgather: Gloo has no bf16 sum)" : "");
      break;
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  removeHooks();
  // Gradients whose storage this engine gives back and allocates must not
  // outlive it as the parameters' .grad.
  if (shardedGradients_) {
    for (Param& p : params_) p.tensor.mutable_grad() = at::Tensor();
  }
  // Never leave a collective running on memory that is about to go away.
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (Bucket& b : buckets_) {
    if (b.work) works.push_back(b.work);
    if (b.gather) works.push_back(b.gather);
  }
  for (Bucket& b : frozenBuckets_) {
    if (b.gather) works.push_back(b.gather);
  }
  waitAll(std::move(works));
}

void DistributedDataParallel::removeHooks() {
  for (Param& p : params_) {
    if (p.accumulator && p.hookKey != 0) p.accumulator->del_post_hook(p.hookKey);
    p.hookKey = 0;
    if (p.preHook >= 0) p.tensor.remove_hook(static_cast<unsigned>(p.preHook));
    p.preHook = -1;
  }
}

std::exception_ptr DistributedDataParallel::waitAll(
    std::vector<c10::intrusive_ptr<c10d::Work>> works, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + comm_.timeout;
  std::exception_ptr first;
  for (auto& w : works) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      comm::Comm c = comm_;
      c.timeout = std::max(left, std::chrono::milliseconds(1));
      comm::wait(w, c, what);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  return first;
}

void DistributedDataParallel::broadcastState() {
  std::vector<at::Tensor> state;
  // Parts cut beforehand are every rank's own already (built from the same
  // seed, or read from the same file; the caller checks they agree).
  for (const Param& p : params_) {
    if (buckets_[p.bucket].preset == nullptr) state.push_back(p.tensor);
  }
  for (const auto& f : frozen_) state.push_back(f);
  for (const Param& p : frozenParams_) {
    if (frozenBuckets_[p.bucket].preset == nullptr) state.push_back(p.tensor);
  }
  for (const auto& b : buffers_) state.push_back(b);
  comm::broadcast(comm_, state, 0, "broadcast of the initial parameters");
  if (options_.zeroStage == 3) shardParameters();
}

bool DistributedDataParallel::gradientsFinite() const {
  if (finiteAfterExchange_) return *finiteAfterExchange_;
  // One rank: the buckets hold what the copies checked.
  if (comm_.worldSize == 1 && checkedGradients_ == params_.size()) return checkedFinite_;
  ++finitenessPasses_;
  torch::NoGradGuard noGrad;
  bool finite = true;
  // A sum is finite exactly when no element is NaN or Inf, unless finite
  // values overflow it: then the gradient is useless too.
  for (const at::Tensor& g : ownGradientTensors()) {
    if (!std::isfinite(g.sum().item<double>())) {
      finite = false;
      break;
    }
  }
  // finishGradients put every gradient back into its bucket. At stage 2 a
  // rank holds the sum of its part only: every rank must hear of a NaN.
  if (options_.zeroStage < 2 || comm_.worldSize == 1) return finite;
  at::Tensor bad = torch::full({1}, finite ? 0.0f : 1.0f);
  comm::allreduceSum(comm_, bad, "agreement on finite gradients");
  return bad.item<float>() == 0;
}

void DistributedDataParallel::syncBuffers() {
  if (!options_.broadcastBuffers || buffers_.empty()) return;
  std::vector<at::Tensor> buffers = buffers_;
  comm::broadcast(comm_, buffers, 0, "broadcast of buffers");
}

void DistributedDataParallel::setSyncGradients(bool sync) {
  std::lock_guard<std::mutex> g(mutex_);
  sync_ = sync;
}

void DistributedDataParallel::onGradReady(size_t index) {
  std::lock_guard<std::mutex> g(mutex_);
  Param& p = params_[index];
  if (!sync_ && !shardedGradients_) {
    // An inner micro-step: into the bucket all the same, where the next
    // micro-steps add theirs (not a second copy of the gradients).
    settleGradient(p);
    return;
  }
  if (p.ready) {
    throw Error(fmt::format(
        "rank {}: the gradient of '{}' became ready twice in one step (backward ran twice "
        "without finishGradients())",
        comm_.rank, p.name));
  }
  settleGradient(p);
  p.ready = true;
  Bucket& b = buckets_[p.bucket];
  COHORT_ASSERT(b.pending > 0, "bucket ", p.bucket, " over-counted");
  if (--b.pending == 0) launchReadyBuckets(/*fromHook=*/true);
}

void DistributedDataParallel::settleGradient(Param& p) {
  // Below stage 2 zeroGrad() dropped the gradient and autograd made a
  // fresh one; otherwise something (a zero_grad that sets .grad to None, a
  // user) replaced it. Accumulated in place: already there.
  if (withoutBuckets_) {
    settleWithoutBucket(p);
    return;
  }
  at::Tensor& grad = p.tensor.mutable_grad();
  if (grad.defined() && grad.is_same(p.gradView)) return;
  torch::NoGradGuard noGrad;
  // No gradient came in (the pre-hook did not run): the bucket may still be unallocated.
  if (shardedGradients_) allocateGradients(p.bucket);
  std::optional<bool> finite = true;
  if (grad.defined()) {
    finite = detail::copyCheckingFinite(p.gradView, grad);
  } else {
    p.gradView.zero_();
  }
  if (finite && sync_) {  // an inner micro-step's check says nothing of the sum
    ++checkedGradients_;
    checkedFinite_ = checkedFinite_ && *finite;
  }
  grad = p.gradView;
}

void DistributedDataParallel::settleWithoutBucket(Param& p) {
  // An inner micro-step: the next one adds to this gradient, and the check
  // is of the sum, at the step that synchronizes.
  if (!sync_) return;
  at::Tensor& grad = p.tensor.mutable_grad();
  torch::NoGradGuard noGrad;
  if (!grad.defined()) {
    grad = at::zeros_like(p.tensor);
    ++checkedGradients_;
    return;
  }
  if (const std::optional<bool> finite = detail::allFinite(grad)) {
    ++checkedGradients_;
    checkedFinite_ = checkedFinite_ && *finite;
  }
}

bool DistributedDataParallel::sumInSharedMemory(std::optional<size_t> k) {
  const auto start = std::chrono::steady_clock::now();
  const auto wallStart = monitor::Timeline::Clock::now();
  comm::CollectiveWait waiting("gradient allreduce (shared memory)");
  const bool finite =
      k ? shm_->allreduce(buckets_[*k].shmOffset, static_cast<size_t>(buckets_[*k].flat.numel()),
                          comm_.timeout)
        : shm_->sumPublished(static_cast<size_t>(totalFloats_), comm_.timeout);
  stats_.sharedMemorySeconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (monitor::Timeline* t = monitor::timeline()) {
    if (k) {
      const Bucket& b = buckets_[*k];
      t->complete(fmt::format("allreduce bucket {} (shared memory)", *k), "comm", wallStart,
                  monitor::Timeline::Clock::now(), 0, bucketArgs(b.flat, b.params.size()));
    } else {
      t->complete("allreduce (shared memory)", "comm", wallStart, monitor::Timeline::Clock::now(), 0,
                  fmt::format(R"({{"bytes":{},"buckets":{}}})", totalFloats_ * 4, buckets_.size()));
    }
  }
  return finite;
}

void DistributedDataParallel::launchReadyBuckets(bool fromHook) {
  while (nextLaunch_ < buckets_.size() && buckets_[nextLaunch_].pending == 0) {
    Bucket& b = buckets_[nextLaunch_];
    if (comm_.worldSize > 1) {
      torch::NoGradGuard noGrad;
      if (shardedGradients_) allocateGradients(nextLaunch_);  // none arrived: zeros
      if (options_.divideGradients) b.flat.div_(comm_.worldSize);
      if (options_.zeroStage >= 2) {
        launchReduceScatter(nextLaunch_);
        ++(fromHook ? stats_.launchedDuringBackward : stats_.launchedAtFinish);
        ++nextLaunch_;
        continue;
      }
      // One machine: published now, summed after backward by whichever
      // rank is free (finishExchange). Hierarchical: this machine's sum,
      // here and synchronously (a pass over memory, cheaper than a thread
      // competing for the cores), which its leader then sends on.
      if (claimedSum_) {
        shm_->publish(b.shmOffset + static_cast<size_t>(b.flat.numel()));
      } else if (shm_) {
        exchangeFinite_ = sumInSharedMemory(nextLaunch_) && exchangeFinite_;
      }
      c10d::ProcessGroup* pg = plan_->exchange == Exchange::gloo ? comm_.pg.get()
                               : plan_->across                   ? plan_->across.get()
                                                                 : nullptr;
      if (pg != nullptr) {
        detail::GlooSum sum = detail::launchSum(*pg, b.flat, options_.compression);
        b.work = std::move(sum.work);
        b.wire = std::move(sum.wire);
        if (monitor::timeline() != nullptr) traceCompletion(b);
      }
    }
    ++(fromHook ? stats_.launchedDuringBackward : stats_.launchedAtFinish);
    ++nextLaunch_;
  }
}

void DistributedDataParallel::finishGradients() {
  releaseAllFrozen();  // backward is over
  if (!sync_) return;
  finishExchange(/*count=*/true);
}

void DistributedDataParallel::finishExchange(bool count) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Parameters without a gradient in this step. Their buckets are launched
  // all the same (the missing gradient counts as what the bucket holds: zero,
  // or earlier micro-steps' sum), so every rank completes the same
  // collectives even when only some ranks see an unused parameter.
  std::string firstUnused;
  for (size_t bi = nextLaunch_; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    for (size_t k : b.params) {
      Param& p = params_[k];
      if (p.ready) continue;
      if (firstUnused.empty()) firstUnused = p.name;
      settleGradient(p);
      p.ready = true;
      --b.pending;
    }
  }
  launchReadyBuckets(/*fromHook=*/false);
  if (claimedSum_ && comm_.worldSize > 1) {
    exchangeFinite_ = sumInSharedMemory(std::nullopt) && exchangeFinite_;
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<size_t> compressed;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (b.work) works.push_back(b.work);
    if (b.wire.defined()) compressed.push_back(k);
    b.work.reset();
  }
  // The shared-memory sums checked every element on the way (when they are
  // the whole exchange: hierarchical ones hold only this machine's sum), of
  // every micro-step at stage 3.
  if (count) {
    ++stats_.syncs;
    if (plan_->exchange == Exchange::sharedMemory) finiteAfterExchange_ = exchangeFinite_;
    exchangeFinite_ = true;
  }
  resetReadiness();
  lock.unlock();
  std::exception_ptr failure = waitAll(
      std::move(works), options_.zeroStage >= 2 ? "gradient reduce-scatter" : "gradient allreduce");
  for (size_t k = 0; k < buckets_.size() && !failure; ++k) {
    if (buckets_[k].received.defined()) completeReduceScatter(k);
  }
  for (size_t k : compressed) {
    Bucket& b = buckets_[k];
    if (!failure) detail::completeSum(b.flat, detail::GlooSum{{}, b.wire, options_.compression});
    b.wire = at::Tensor();
  }
  if (!failure && plan_->exchange == Exchange::hierarchical && shm_ && options_.zeroStage < 2) {
    // The leader holds the sum over all machines: one copy of every bucket
    // to the other ranks of its machine. (A leader whose Gloo sum failed
    // throws instead; its machine's ranks then see it exit, or time out.)
    const auto wallStart = monitor::Timeline::Clock::now();
    comm::CollectiveWait waiting("gradient broadcast from this machine's leader (shared memory)");
    shm_->broadcast(0, static_cast<size_t>(totalFloats_), 0, comm_.timeout);
    if (monitor::Timeline* t = monitor::timeline()) {
      t->complete("broadcast from the machine's leader (shared memory)", "comm", wallStart,
                  monitor::Timeline::Clock::now(), 0,
                  fmt::format(R"({{"bytes":{}}})", totalFloats_ * 4));
    }
  }
  if (monitor::Timeline* t = monitor::timeline();
      t != nullptr && plan_->exchange != Exchange::sharedMemory) {
    // Gloo runs the allreduces on its own threads: one timeline row for them.
    const int64_t now = micros(monitor::Timeline::Clock::now());
    for (size_t k = 0; k < buckets_.size(); ++k) {
      Bucket& b = buckets_[k];
      if (b.launchedUs == 0) continue;
      const int64_t done = b.completedUs && *b.completedUs > 0 ? b.completedUs->load() : now;
      const char* op = options_.zeroStage >= 2 ? "reduce-scatter" : "allreduce";
      t->complete(fmt::format("{} bucket {}", op, k), "comm", timePoint(b.launchedUs),
                  timePoint(std::max(done, b.launchedUs)), 2, bucketArgs(b.flat, b.params.size()));
      b.launchedUs = 0;
    }
  }
  if (failure) std::rethrow_exception(failure);
  if (!firstUnused.empty() && !options_.findUnusedParameters) {
    throw Error(fmt::format(
        "rank {}: parameter '{}' received no gradient in this step; every parameter must "
        "contribute to the loss, or set distribution.find_unused_parameters: true",
        comm_.rank, firstUnused));
  }
}

void DistributedDataParallel::traceCompletion(Bucket& b) {
  b.launchedUs = micros(monitor::Timeline::Clock::now());
  b.completedUs = std::make_shared<std::atomic<int64_t>>(0);
  try {
    auto done = b.completedUs;
    b.work->getFuture()->addCallback([done](c10::ivalue::Future&) {
      done->store(micros(monitor::Timeline::Clock::now()));
    });
  } catch (const std::exception&) {
    // No future for this work: the completion is taken when it is waited on.
  }
}

void DistributedDataParallel::zeroGrad() {
  finiteAfterExchange_.reset();
  checkedGradients_ = 0;
  checkedFinite_ = true;
  torch::NoGradGuard noGrad;
  if (!shardedGradients_) {
    // Each slot is overwritten by the next backward's gradient, or zeroed
    // when the parameter gets none (settleGradient).
    for (Param& p : params_) p.tensor.mutable_grad() = at::Tensor();
    return;
  }
  for (Bucket& b : buckets_) {
    if (b.flatLive) b.flat.zero_();
    b.part.mutable_grad().zero_();
  }
  for (Param& p : params_) {
    at::Tensor& grad = p.tensor.mutable_grad();
    if (!grad.defined() || !grad.is_same(p.gradView)) grad = p.gradView;
  }
}

void DistributedDataParallel::resetReadiness() {
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
  }
  for (Param& p : params_) p.ready = false;
  nextLaunch_ = 0;
}

std::vector<std::vector<std::string>> DistributedDataParallel::namesOf(const std::vector<Bucket>& list,
                                                                       const std::vector<Param>& params) {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : list) {
    out.emplace_back();
    for (size_t k : b.params) out.back().push_back(params[k].name);
  }
  return out;
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucketParameterNames() const {
  return namesOf(buckets_, params_);
}

DdpStats DistributedDataParallel::stats() const {
  std::lock_guard<std::mutex> g(mutex_);
  DdpStats s = stats_;
  s.finitenessPasses = finitenessPasses_;
  return s;
}

}  // namespace cohort::parallel
