// ZeRO stage 3 in the data-parallel engine (ddp.h, docs/zero.md): buckets
// by sharding unit, the parameters held in parts between uses, each unit
// gathered around its forward and its backward (the next one prefetched),
// and its full parameters and gradients freed once its gradients are
// reduce-scattered. The gradients' allocate-and-free and the staging
// reduce-scatter on shared memory serve stage 2 too.
//
// A unit's parameters stay views of its flat buffer for the engine's life;
// freeing gives the buffer's storage back and gathering allocates it again,
// so every tensor autograd saved in forward sees the gathered values when
// backward reads it.

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>

#include "cohort/comm/shm.h"
#include "cohort/comm/wait.h"
#include "cohort/core/error.h"
#include "cohort/parallel/ddp.h"
#include "cohort/monitor/timeline.h"

namespace cohort::parallel {

namespace {

using models::allocateStorage;
using models::releaseStorage;

// Buckets 0 .. n-1 are the model's units, the last one in forward order
// first; the whole-model bucket, if any, comes after them.
int unitBuckets(size_t buckets, int wholeBucket) {
  return static_cast<int>(buckets) - (wholeBucket >= 0 ? 1 : 0);
}

}  // namespace

// What the model runs each unit's forward through.
class DistributedDataParallel::Runner : public models::UnitRunner {
 public:
  explicit Runner(DistributedDataParallel& ddp) : ddp_(ddp) {}
  at::Tensor run(int unit, const Forward& f, const at::Tensor& x) override;

 private:
  DistributedDataParallel& ddp_;
};

// Identity in forward; in backward, before any of the unit's own nodes
// (they all lie behind its output), gathers the unit's parameters (and
// frozen ones) and allocates its gradient bucket.
struct DistributedDataParallel::BeforeBackward
    : public torch::autograd::Function<DistributedDataParallel::BeforeBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& y,
                            int64_t engine, int64_t unit) {
    ctx->saved_data["engine"] = engine;
    ctx->saved_data["unit"] = unit;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* ddp = reinterpret_cast<DistributedDataParallel*>(ctx->saved_data["engine"].toInt());
    ddp->beforeBackward(static_cast<int>(ctx->saved_data["unit"].toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

int DistributedDataParallel::bucketUnits(std::vector<Param>& params, std::vector<Bucket>& out,
                                         std::map<std::string, UnitPart>& presharded,
                                         std::vector<int>& unitBuckets) {
  const size_t units = options_.units.size();
  // members[units]: the parameters outside every unit.
  std::vector<std::vector<size_t>> members(units + 1);
  for (size_t k = params.size(); k-- > 0;) {
    size_t u = units;
    for (size_t i = 0; i < units; ++i) {
      if (params[k].name.rfind(options_.units[i] + ".", 0) == 0) {
        u = i;
        break;
      }
    }
    members[u].push_back(k);
  }
  auto add = [&](std::vector<size_t> indices) {
    const at::Tensor& first = params[indices.front()].tensor;
    for (size_t k : indices) {
      const at::Tensor& t = params[k].tensor;
      if (t.scalar_type() != first.scalar_type() || t.device() != first.device()) {
        throw ConfigError(fmt::format(
            "distribution.zero: stage 3 gathers a unit's parameters in one buffer, but '{}' is {} "
            "on {} and '{}' is {} on {}",
            params[indices.front()].name, c10::toString(first.scalar_type()), first.device().str(),
            params[k].name, c10::toString(t.scalar_type()), t.device().str()));
      }
    }
    out.emplace_back();
    out.back().params = std::move(indices);
    return static_cast<int>(out.size() - 1);
  };
  // In the order backward completes them: the last unit first, the
  // parameters outside the units (the embeddings, used first) last.
  std::vector<int> of(units + 1, -1);
  for (size_t i = units; i-- > 0;) {
    if (!members[i].empty()) of[i] = add(std::move(members[i]));
  }
  if (!members[units].empty()) of[units] = add(std::move(members[units]));
  for (size_t i = 0; i <= units; ++i) {
    auto it = presharded.find(i < units ? options_.units[i] : std::string());
    if (of[i] < 0 || it == presharded.end()) continue;
    Bucket& b = out[static_cast<size_t>(of[i])];
    std::vector<std::string> names;
    for (auto p = b.params.rbegin(); p != b.params.rend(); ++p) names.push_back(params[*p].name);
    if (names != it->second.names) {
      throw Error(fmt::format("ZeRO stage 3: the part cut of unit '{}' holds [{}], its bucket [{}]",
                              it->first, fmt::join(it->second.names, ", "), fmt::join(names, ", ")));
    }
    b.preset = &it->second;
  }
  for (size_t k = 0; k < out.size(); ++k) {
    for (size_t p : out[k].params) params[p].bucket = k;
  }
  const int whole = of.back();
  of.pop_back();
  unitBuckets = std::move(of);
  return whole;
}

void DistributedDataParallel::bucketByUnit() {
  wholeBucket_ = bucketUnits(params_, buckets_, options_.presharded, unitBucket_);
  if (options_.shardFrozen) {
    frozenWhole_ = bucketUnits(frozenParams_, frozenBuckets_, options_.frozenPresharded, frozenBucket_);
  }
  runner_ = std::make_shared<Runner>(*this);
  // A unit's trainable and frozen parameters are gathered together.
  auto elements = [](const std::vector<Param>& params, const std::vector<Bucket>& list, int k) {
    int64_t n = 0;
    if (k >= 0) {
      for (size_t p : list[static_cast<size_t>(k)].params) n += params[p].tensor.numel();
    }
    return n;
  };
  for (int u = -1; u < static_cast<int>(unitBucket_.size()); ++u) {
    const int k = u < 0 ? wholeBucket_ : unitBucket_[static_cast<size_t>(u)];
    stats_.largestUnitElements = std::max(
        stats_.largestUnitElements, elements(params_, buckets_, k) +
                                        elements(frozenParams_, frozenBuckets_, frozenOfUnit(u)));
  }
}

at::Tensor cutUnit(const std::vector<std::pair<std::string, at::Tensor>>& values, int parts,
                   int index) {
  torch::NoGradGuard noGrad;
  int64_t total = 0;
  for (const auto& [name, t] : values) total += t.numel();
  const int64_t padded = (total + parts - 1) / parts * parts, chunk = padded / parts;
  COHORT_ASSERT(!values.empty() && index >= 0 && index < parts, "cutUnit");
  at::Tensor flat = torch::zeros({padded}, values.front().second.options());
  int64_t offset = 0;
  for (auto v = values.rbegin(); v != values.rend(); ++v) {
    const at::Tensor& t = v->second;
    at::Tensor slot = flat.narrow(0, offset, t.numel());
    (t.is_non_overlapping_and_dense() ? slot.as_strided(t.sizes(), t.strides()) : slot.view(t.sizes()))
        .copy_(t);
    offset += t.numel();
  }
  return flat.narrow(0, chunk * index, chunk).clone();
}

models::UnitRunner* DistributedDataParallel::unitRunner() { return runner_.get(); }

void DistributedDataParallel::shardParameters() {
  torch::NoGradGuard noGrad;
  const int64_t world = comm_.worldSize;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (b.preset != nullptr) continue;  // cut already, its weights released
    b.part.detach().copy_(b.weights.narrow(0, b.padded / world * comm_.rank, b.padded / world));
    releaseWeights(b);
  }
  for (Bucket& b : frozenBuckets_) {
    if (b.preset != nullptr) continue;
    b.part.copy_(b.weights.narrow(0, b.padded / world * comm_.rank, b.padded / world));
    releaseWeights(b);
  }
  if (unitsInSharedMemory_) {
    comm::CollectiveWait waiting("barrier after sharding the parameters (ZeRO stage 3)");
    shm_->barrier(comm_.timeout);
  }
  stats_.unitPeakElements = 0;  // from here on: training
}

void DistributedDataParallel::noteUnitElements(int64_t delta) {
  unitElements_ += delta;
  stats_.unitPeakElements = std::max(stats_.unitPeakElements, unitElements_);
}

void DistributedDataParallel::launchGather(Bucket& b) {
  // On shared memory a gather is a copy: done when needed, not ahead.
  if (b.weightsLive || b.gather || unitsInSharedMemory_) return;
  torch::NoGradGuard noGrad;
  allocateWeights(b);
  if (comm_.worldSize == 1) {
    b.weights.copy_(b.part.detach());
    b.weightsLive = true;
    return;
  }
  const int64_t chunk = b.padded / comm_.worldSize;
  std::vector<at::Tensor> in{b.part.detach()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < comm_.worldSize; ++r) out[0].push_back(b.weights.narrow(0, chunk * r, chunk));
  b.gather = comm_.pg->allgather(out, in);
}

void DistributedDataParallel::gatherNow(Bucket& b) {
  if (unitsInSharedMemory_) {
    gatherFromSharedMemory(b);
    return;
  }
  launchGather(b);
  if (b.gather) {
    auto work = std::move(b.gather);
    b.gather.reset();
    comm::wait(work, comm_, "parameter gather (ZeRO stage 3)");
  }
  b.weightsLive = true;
}

void DistributedDataParallel::gatherFromSharedMemory(Bucket& b) {
  if (b.weightsLive) return;
  torch::NoGradGuard noGrad;
  allocateWeights(b);
  // Every part was written before the barrier that ended the step (or the
  // sharding), and nothing writes one before every rank's last reduce-scatter
  // of the next step: read in place, no barrier.
  const int64_t chunk = b.padded / comm_.worldSize;
  for (int r = 0; r < comm_.worldSize; ++r) {
    at::Tensor to = b.weights.narrow(0, chunk * r, chunk);
    if (r == comm_.rank) {
      to.copy_(b.part.detach());
    } else {
      to.copy_(torch::from_blob(shm_->regionOf(r) + b.shmOffset, {chunk}, b.weights.options()));
    }
  }
  b.weightsLive = true;
}

void DistributedDataParallel::reduceScatterInStaging(size_t k) {
  torch::NoGradGuard noGrad;
  Bucket& b = buckets_[k];
  allocateGradients(k);  // a bucket without gradients in this step sends zeros
  if (options_.zeroStage == 3) releaseWeights(b);  // its gradients are all in: its parameters are done with
  const auto start = std::chrono::steady_clock::now();
  const auto wallStart = monitor::Timeline::Clock::now();
  // The bucket's gradients go to the staging area (reused by every bucket:
  // a reduce-scatter returns once every rank has read its chunk there).
  at::Tensor staging =
      torch::from_blob(shm_->region() + stagingShmOffset_, {b.padded}, b.flat.options());
  staging.copy_(b.flat);
  releaseGradients(k);
  comm::CollectiveWait waiting("gradient reduce-scatter (shared memory)");
  const bool finite =
      shm_->reduceScatter(stagingShmOffset_, static_cast<size_t>(b.padded), comm_.timeout);
  exchangeFinite_ = finite && exchangeFinite_;
  const int64_t chunk = b.padded / comm_.worldSize;
  b.part.mutable_grad().add_(staging.narrow(0, chunk * comm_.rank, chunk));
  stats_.sharedMemorySeconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (monitor::Timeline* t = monitor::timeline()) {
    t->complete(fmt::format("reduce-scatter bucket {} (shared memory)", k), "comm", wallStart,
                monitor::Timeline::Clock::now(), 0,
                fmt::format(R"({{"bytes":{},"parameters":{}}})", b.padded * 4, b.params.size()));
  }
}

void DistributedDataParallel::allocateWeights(Bucket& b) {
  allocateStorage(b.weights);
  noteUnitElements(b.padded);
}

void DistributedDataParallel::releaseWeights(Bucket& b) {
  if (b.gather) {
    // Never free what a collective is still writing. A gather launched
    // ahead and never used (a unit backward did not reach) holds its
    // storage all the same: freed below.
    auto work = std::move(b.gather);
    b.gather.reset();
    comm::wait(work, comm_, "parameter gather (ZeRO stage 3)");
    b.weightsLive = true;
  }
  if (!b.weightsLive) return;
  releaseStorage(b.weights);
  noteUnitElements(-b.padded);
  b.weightsLive = false;
}

void DistributedDataParallel::allocateGradients(size_t k) {
  Bucket& b = buckets_[k];
  if (b.flatLive) return;
  allocateStorage(b.flat);
  noteUnitElements(b.padded);
  b.flat.zero_();
  b.flatLive = true;
}

void DistributedDataParallel::releaseGradients(size_t k) {
  Bucket& b = buckets_[k];
  if (!b.flatLive) return;
  releaseStorage(b.flat);
  noteUnitElements(-b.padded);
  b.flatLive = false;
}

void DistributedDataParallel::beforeBackward(int unit) {
  monitor::TimelineSpan span("gather a unit for backward (ZeRO stage 3)", "comm");
  const bool whole = unit == models::UnitRunner::kWholeModel;
  // Backward has left the units after this one: their frozen parameters
  // are done with (each unit's gradient reaches the one before it only
  // once all of the unit's nodes that read them ran).
  for (size_t u = whole ? unitBucket_.size() : static_cast<size_t>(unit) + 1; u < unitBucket_.size(); ++u) {
    if (frozenBucket_.size() > u && frozenBucket_[u] >= 0) releaseWeights(frozenBuckets_[static_cast<size_t>(frozenBucket_[u])]);
  }
  const int k = whole ? wholeBucket_ : unitBucket_[static_cast<size_t>(unit)];
  if (k >= 0) {
    gatherNow(buckets_[static_cast<size_t>(k)]);
    allocateGradients(static_cast<size_t>(k));
    // Backward reaches the units in bucket order, after the whole-model one.
    const int next = k == wholeBucket_ ? 0 : k + 1;
    if (next < unitBuckets(buckets_.size(), wholeBucket_)) launchGather(buckets_[static_cast<size_t>(next)]);
  }
  const int f = frozenOfUnit(unit);
  if (f >= 0) {
    gatherNow(frozenBuckets_[static_cast<size_t>(f)]);
    const int next = f == frozenWhole_ ? 0 : f + 1;
    if (next < unitBuckets(frozenBuckets_.size(), frozenWhole_)) launchGather(frozenBuckets_[static_cast<size_t>(next)]);
  }
}

at::Tensor DistributedDataParallel::Runner::run(int unit, const Forward& f, const at::Tensor& x) {
  DistributedDataParallel& d = ddp_;
  const bool whole = unit == kWholeModel;
  if (!whole && (unit < 0 || static_cast<size_t>(unit) >= d.unitBucket_.size())) return f(x);
  const int k = whole ? d.wholeBucket_ : d.unitBucket_[static_cast<size_t>(unit)];
  const int fz = d.frozenOfUnit(unit);
  if (k < 0 && fz < 0) return f(x);
  // Forward reaches the units in the reverse of bucket order, after the
  // whole-model one; the next one's gather is launched now.
  auto gather = [](DistributedDataParallel& e, std::vector<Bucket>& list, int at, int wholeAt) {
    if (at < 0) return;
    e.gatherNow(list[static_cast<size_t>(at)]);
    const int next = at == wholeAt ? unitBuckets(list.size(), wholeAt) - 1 : at - 1;
    if (next >= 0) e.launchGather(list[static_cast<size_t>(next)]);
  };
  auto release = [&] {
    if (k >= 0) d.releaseWeights(d.buckets_[static_cast<size_t>(k)]);
    if (fz >= 0) d.releaseWeights(d.frozenBuckets_[static_cast<size_t>(fz)]);
  };
  at::Tensor y;
  try {
    {
      monitor::TimelineSpan span("gather a unit for forward (ZeRO stage 3)", "comm");
      gather(d, d.buckets_, k, d.wholeBucket_);
      gather(d, d.frozenBuckets_, fz, d.frozenWhole_);
    }
    y = f(x);
  } catch (...) {
    release();
    throw;
  }
  release();
  if (torch::GradMode::is_enabled() && y.requires_grad()) {
    y = BeforeBackward::apply(y, reinterpret_cast<int64_t>(&d), static_cast<int64_t>(unit));
  }
  return y;
}

void DistributedDataParallel::completeLaunched() {
  for (size_t j = 0; j < buckets_.size(); ++j) {
    Bucket& b = buckets_[j];
    if (!b.work || !b.received.defined()) continue;
    auto work = std::move(b.work);
    b.work.reset();
    comm::wait(work, comm_, "gradient reduce-scatter");
    completeReduceScatter(j);
  }
}

void DistributedDataParallel::endMicroStep() {
  releaseAllFrozen();
  if (shardedGradients_ && !sync_) finishExchange(/*count=*/false);
}

void DistributedDataParallel::gatherAllParameters(int root) {
  for (size_t k = 0; k < buckets_.size(); ++k) gatherBucket(root, k);
}

void DistributedDataParallel::gatherBucket(int root, size_t k) {
  if (options_.zeroStage < 3) return;
  gatherToRoot(buckets_[k], root);
}

void DistributedDataParallel::gatherToRoot(Bucket& b, int root) {
  if (unitsInSharedMemory_ || comm_.worldSize == 1) {
    // Copies from the segment: only `root` makes them.
    if (comm_.rank == root) gatherNow(b);
    return;
  }
  // A Gloo gather to `root`: the other ranks send their parts and allocate
  // nothing.
  torch::NoGradGuard noGrad;
  std::vector<at::Tensor> in{b.part.detach()};
  std::vector<std::vector<at::Tensor>> out;
  if (comm_.rank == root) {
    if (!b.weightsLive) allocateWeights(b);
    b.weightsLive = true;
    const int64_t chunk = b.padded / comm_.worldSize;
    out.emplace_back();
    for (int r = 0; r < comm_.worldSize; ++r) out[0].push_back(b.weights.narrow(0, chunk * r, chunk));
  }
  c10d::GatherOptions options;
  options.rootRank = root;
  std::vector<c10::intrusive_ptr<c10d::Work>> works{comm_.pg->gather(out, in, options)};
  if (std::exception_ptr failure = waitAll(std::move(works), "parameter gather for a save")) {
    std::rethrow_exception(failure);
  }
}

void DistributedDataParallel::releaseParameters() {
  if (options_.zeroStage < 3) return;
  for (Bucket& b : buckets_) releaseWeights(b);
  releaseAllFrozen();
}

void DistributedDataParallel::releaseBucket(size_t k) {
  if (options_.zeroStage == 3) releaseWeights(buckets_[k]);
}

}  // namespace cohort::parallel
