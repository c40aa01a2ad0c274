#include "cohort/ddp/ddp.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include "cohort/comm/shm.h"
#include "cohort/core/error.h"
#include "cohort/monitor/activity.h"
#include "cohort/monitor/timeline.h"
#include "cohort/core/log.h"

namespace cohort::ddp {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 comm::Comm comm, DdpOptions options)
    : module_(std::move(module)), comm_(std::move(comm)), options_(options) {
  COHORT_ASSERT(module_ != nullptr, "no module");
  std::set<const void*> seen;  // tied weights appear under several names: bucket them once
  for (const auto& p : module_->named_parameters()) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    if (!p.value().requires_grad()) {
      frozen_.push_back(p.value());
      continue;
    }
    Param param;
    param.name = p.key();
    param.tensor = p.value();
    params_.push_back(std::move(param));
  }
  for (const auto& b : module_->named_buffers()) buffers_.push_back(b.value());

  // Buckets in reverse registration order, split by dtype and device and by
  // the size cap (a parameter larger than the cap gets a bucket of its own).
  const double capBytes = options_.bucketCapMb * 1024.0 * 1024.0;
  double bucketBytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
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

  torch::NoGradGuard noGrad;
  int64_t allFloats = 0;
  bool shmEligible = options_.sharedMemory && comm_.worldSize > 1 && !buckets_.empty();
  for (const Bucket& b : buckets_) {
    for (size_t k : b.params) {
      const at::Tensor& t = params_[k].tensor;
      shmEligible = shmEligible && t.scalar_type() == at::kFloat && t.device().is_cpu();
      allFloats += t.numel();
    }
  }
  if (shmEligible) setUpSharedMemory(allFloats);
  size_t shmOffset = 0;
  for (Bucket& b : buckets_) {
    int64_t total = 0;
    for (size_t k : b.params) total += params_[k].tensor.numel();
    if (shm_) {
      // A view of this rank's region; the deleter keeps the mapping alive
      // as long as any gradient tensor points into it.
      auto keep = shm_;
      b.flat = torch::from_blob(shm_->region() + shmOffset, {total},
                                [keep](void*) mutable { keep.reset(); },
                                params_[b.params.front()].tensor.options());
      b.flat.zero_();
      b.shmOffset = shmOffset;
      shmOffset += static_cast<size_t>(total);
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

// This machine, as every rank sees it: host name and boot id.
std::string machineId() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) boot = buf;
    std::fclose(f);
  }
  return std::string(host) + "/" + boot;
}

}  // namespace

void DistributedDataParallel::setUpSharedMemory(int64_t totalFloats) {
  // Every DDP of a job is built in the same order on every rank: number them
  // for the store keys.
  static std::atomic<int> instances{0};
  const int instance = instances++;
  const std::string prefix = fmt::format("ddp/{}/shm", instance);
  const comm::Comm& c = comm_;
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  auto text = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  c.store->set(fmt::format("{}/machine/{}", prefix, c.rank), bytes(machineId()));
  bool oneMachine = true;
  for (int r = 0; r < c.worldSize; ++r) {
    const std::string key = fmt::format("{}/machine/{}", prefix, r);
    c.store->wait({key}, c.timeout);
    oneMachine = oneMachine && text(c.store->get(key)) == machineId();
  }
  if (!oneMachine) {
    log::info("gradient exchange: Gloo (the ranks span several machines)");
    return;
  }
  // Rank 0 creates the segment and says whether that worked; the others open
  // it; once all have it mapped, its name is removed.
  std::string name;
  std::string error;
  if (c.rank == 0) {
    name = fmt::format("/cohort-{}-{}-{}", ::getpid(), instance, c.storePort);
    try {
      shm_ = std::make_shared<comm::ShmAllreduce>(name, 0, c.worldSize, totalFloats, true);
    } catch (const Error& e) {
      error = e.what();
    }
    c.store->set(prefix + "/name", bytes(error.empty() ? name : "!" + error));
  } else {
    c.store->wait({prefix + "/name"}, c.timeout);
    name = text(c.store->get(prefix + "/name"));
    if (!name.empty() && name[0] == '!') {
      error = name.substr(1);
    } else {
      try {
        shm_ = std::make_shared<comm::ShmAllreduce>(name, c.rank, c.worldSize, totalFloats, false);
      } catch (const Error& e) {
        error = e.what();
      }
    }
  }
  // Every rank must take the same path: agree on whether all mapped it.
  at::Tensor ok = torch::tensor({shm_ ? 0.0 : 1.0}, torch::kFloat64);
  comm::allreduceSum(c, ok, "shared memory set-up");
  if (c.rank == 0 && shm_) shm_->unlink();
  if (ok.item<double>() > 0) {
    shm_.reset();
    log::warn("gradient exchange: Gloo, as shared memory could not be set up{}",
              error.empty() ? " on another rank" : ": " + error);
    return;
  }
  stats_.sharedMemory = true;
  log::info("gradient exchange: shared memory ({} MB per rank)", totalFloats * 4 >> 20);
}

DistributedDataParallel::~DistributedDataParallel() {
  removeHooks();
  // Never leave a collective running on memory that is about to go away.
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (Bucket& b : buckets_) {
    if (b.work) works.push_back(b.work);
  }
  waitAll(std::move(works));
}

void DistributedDataParallel::removeHooks() {
  for (Param& p : params_) {
    if (p.accumulator && p.hookKey != 0) p.accumulator->del_post_hook(p.hookKey);
    p.hookKey = 0;
  }
}

std::exception_ptr DistributedDataParallel::waitAll(
    std::vector<c10::intrusive_ptr<c10d::Work>> works) {
  const auto deadline = std::chrono::steady_clock::now() + comm_.timeout;
  std::exception_ptr first;
  for (auto& w : works) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      comm::Comm c = comm_;
      c.timeout = std::max(left, std::chrono::milliseconds(1));
      comm::wait(w, c, "gradient allreduce");
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  return first;
}

void DistributedDataParallel::broadcastState() {
  std::vector<at::Tensor> state;
  for (const Param& p : params_) state.push_back(p.tensor);
  for (const auto& f : frozen_) state.push_back(f);
  for (const auto& b : buffers_) state.push_back(b);
  comm::broadcast(comm_, state, 0, "broadcast of the initial parameters");
}

bool DistributedDataParallel::gradientsFinite() const {
  if (finiteAfterExchange_) return *finiteAfterExchange_;
  torch::NoGradGuard noGrad;
  for (const Bucket& b : buckets_) {
    // A sum is finite exactly when no element is NaN or Inf, unless finite
    // values overflow it: then the gradient is useless too.
    if (!std::isfinite(b.flat.sum().item<double>())) return false;
  }
  return true;  // finishGradients put every gradient back into its bucket
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
  if (!sync_) return;
  Param& p = params_[index];
  if (p.ready) {
    throw Error(fmt::format(
        "rank {}: the gradient of '{}' became ready twice in one step (backward ran twice "
        "without finishGradients())",
        comm_.rank, p.name));
  }
  // Something (a zero_grad that sets .grad to None, a user) replaced the
  // gradient: put it back into the bucket.
  at::Tensor& grad = p.tensor.mutable_grad();
  if (!grad.defined() || !grad.is_same(p.gradView)) {
    torch::NoGradGuard noGrad;
    if (grad.defined()) {
      p.gradView.copy_(grad);
    } else {
      p.gradView.zero_();
    }
    grad = p.gradView;
  }
  p.ready = true;
  Bucket& b = buckets_[p.bucket];
  COHORT_ASSERT(b.pending > 0, "bucket ", p.bucket, " over-counted");
  if (--b.pending == 0) launchReadyBuckets(/*fromHook=*/true);
}

void DistributedDataParallel::launchReadyBuckets(bool fromHook) {
  while (nextLaunch_ < buckets_.size() && buckets_[nextLaunch_].pending == 0) {
    Bucket& b = buckets_[nextLaunch_];
    if (comm_.worldSize > 1) {
      torch::NoGradGuard noGrad;
      if (options_.divideGradients) b.flat.div_(comm_.worldSize);
      if (shm_) {
        // Synchronous: on a shared machine the sum is a pass over memory,
        // cheaper done here than handed to a thread competing for the cores.
        const auto start = std::chrono::steady_clock::now();
        const auto wallStart = monitor::Timeline::Clock::now();
        monitor::WaitScope waiting("gradient allreduce (shared memory)");
        exchangeFinite_ =
            shm_->allreduce(b.shmOffset, static_cast<size_t>(b.flat.numel()), comm_.timeout) &&
            exchangeFinite_;
        stats_.sharedMemorySeconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (monitor::Timeline* t = monitor::timeline()) {
          t->complete(fmt::format("allreduce bucket {} (shared memory)", nextLaunch_), "comm",
                      wallStart, monitor::Timeline::Clock::now(), 0, bucketArgs(b.flat, b.params.size()));
        }
      } else {
        std::vector<at::Tensor> v{b.flat};
        b.work = comm_.pg->allreduce(v);
        if (monitor::timeline() != nullptr) traceCompletion(b);
      }
    }
    ++(fromHook ? stats_.launchedDuringBackward : stats_.launchedAtFinish);
    ++nextLaunch_;
  }
}

void DistributedDataParallel::finishGradients() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!sync_) return;
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
      p.ready = true;
      --b.pending;
    }
  }
  launchReadyBuckets(/*fromHook=*/false);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (Bucket& b : buckets_) {
    if (b.work) works.push_back(b.work);
    b.work.reset();
  }
  ++stats_.syncs;
  // The shared-memory sums checked every element on the way.
  if (shm_) finiteAfterExchange_ = exchangeFinite_;
  exchangeFinite_ = true;
  resetReadiness();
  lock.unlock();
  std::exception_ptr failure = waitAll(std::move(works));
  if (monitor::Timeline* t = monitor::timeline(); t != nullptr && !shm_) {
    // Gloo runs the allreduces on its own threads: one timeline row for them.
    const int64_t now = micros(monitor::Timeline::Clock::now());
    for (size_t k = 0; k < buckets_.size(); ++k) {
      Bucket& b = buckets_[k];
      if (b.launchedUs == 0) continue;
      const int64_t done = b.completedUs && *b.completedUs > 0 ? b.completedUs->load() : now;
      t->complete(fmt::format("allreduce bucket {}", k), "comm", timePoint(b.launchedUs),
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
  torch::NoGradGuard noGrad;
  for (Bucket& b : buckets_) b.flat.zero_();
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

std::vector<std::vector<std::string>> DistributedDataParallel::bucketParameterNames() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (size_t k : b.params) out.back().push_back(params_[k].name);
  }
  return out;
}

DdpStats DistributedDataParallel::stats() const {
  std::lock_guard<std::mutex> g(mutex_);
  return stats_;
}

}  // namespace cohort::ddp
