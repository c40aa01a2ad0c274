// ZeRO's parts of the data-parallel engine (ddp.h, docs/zero.md): the flat
// parameters and this rank's part of each bucket, the stage-2
// reduce-scatter, the gather of the stepped parts, and the gradient
// operations that must see only the part a rank steps.

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>

#include "cohort/comm/shm.h"
#include "cohort/comm/wait.h"
#include "cohort/core/error.h"
#include "cohort/parallel/ddp.h"
#include "cohort/monitor/timeline.h"
#include "parallel/detail/exchange.h"
#include "parallel/detail/unit_memory.h"

namespace cohort::parallel {

namespace {

// Part `rank` of a bucket of `padded` floats cut into `parts` parts.
at::Tensor partOf(const at::Tensor& flat, int64_t padded, int parts, int rank) {
  const int64_t chunk = padded / parts;
  return flat.narrow(0, chunk * rank, chunk);
}

}  // namespace

int64_t DistributedDataParallel::moveIntoWeights(Bucket& b, std::vector<Param>& params) {
  int64_t offset = 0;
  for (size_t k : b.params) {
    Param& p = params[k];
    const int64_t n = p.tensor.numel();
    at::Tensor slot = b.weights.narrow(0, offset, n);
    at::Tensor view = p.tensor.is_non_overlapping_and_dense()
                          ? slot.as_strided(p.tensor.sizes(), p.tensor.strides())
                          : slot.view(p.tensor.sizes());
    if (b.preset == nullptr) view.copy_(p.tensor);
    p.tensor.set_data(view);
    offset += n;
  }
  return offset;
}

void DistributedDataParallel::setUpParts() {
  torch::NoGradGuard noGrad;
  const bool inShm =
      shm_ != nullptr && plan_->exchange == Exchange::sharedMemory && options_.zeroStage < 3;
  for (Bucket& b : buckets_) {
    const at::TensorOptions options = params_[b.params.front()].tensor.options();
    if (inShm) {
      auto keep = shm_;
      b.weights = torch::from_blob(shm_->region() + weightsShmOffset_ + b.shmOffset, {b.padded},
                                   [keep](void*) mutable { keep.reset(); }, options);
      b.weights.zero_();
    } else {
      // Stage 3 writes every element below (the padding too) before the
      // parameters' old storage goes, one bucket at a time: at no point
      // is the model held twice.
      b.weights = options_.zeroStage == 3 ? detail::unitBuffer(b.padded, options)
                                          : torch::zeros({b.padded}, options);
    }
    // Each parameter's data moves into the flat buffer, in the layout of
    // its gradient's slot (so element i of a part is element i of both).
    // A bucket cut already (DdpOptions::presharded): its parameters become
    // views of `weights` without reading them, and `weights` is released
    // before it was ever touched.
    const int64_t offset = moveIntoWeights(b, params_);
    if (b.preset != nullptr) {
      const at::Tensor& cut = b.preset->part;
      if (cut.numel() != b.padded / comm_.worldSize || cut.scalar_type() != options.dtype().toScalarType()) {
        throw Error(fmt::format("ZeRO stage 3: a part cut beforehand holds {} {} elements, the "
                                "engine's {} {}",
                                cut.numel(), c10::toString(cut.scalar_type()), b.padded / comm_.worldSize,
                                c10::toString(options.dtype().toScalarType())));
      }
      b.part = cut.detach().to(options.device());
      models::releaseStorage(b.weights);
      b.weightsLive = false;
    } else {
      if (offset < b.padded) b.weights.narrow(0, offset, b.padded - offset).zero_();
      b.part = partOf(b.weights, b.padded, comm_.worldSize, comm_.rank).detach();
    }
    if (unitsInSharedMemory_) {
      // The only copy between uses, in this rank's region, where the other
      // ranks gather it from.
      auto keep = shm_;
      at::Tensor part = torch::from_blob(shm_->region() + b.shmOffset, {b.padded / comm_.worldSize},
                                         [keep](void*) mutable { keep.reset(); }, options);
      b.part = part.copy_(b.part);
      if (b.preset != nullptr) b.preset->part = at::Tensor();  // the segment holds it now
    } else if (options_.zeroStage == 3) {
      // The part is the only copy between uses; on more than one rank its
      // gradient is a buffer of its own, summed into from every micro-step.
      if (b.preset == nullptr) b.part = b.part.clone();
    }
    b.part.set_requires_grad(true);
    b.part.mutable_grad() = shardedGradients_
                                ? torch::zeros({b.padded / comm_.worldSize}, b.flat.options())
                                : partOf(b.flat, b.padded, comm_.worldSize, comm_.rank);
  }
}

at::Tensor DistributedDataParallel::ownGradients(const Bucket& b) const {
  return options_.zeroStage >= 2 ? b.part.grad() : b.flat;
}

std::vector<at::Tensor> DistributedDataParallel::optimizerParameters() const {
  std::vector<at::Tensor> out;
  if (options_.zeroStage == 0) {
    for (const Param& p : params_) out.push_back(p.tensor);
  } else {
    for (const Bucket& b : buckets_) out.push_back(b.part);
  }
  return out;
}

std::vector<std::vector<DistributedDataParallel::Slice>> DistributedDataParallel::optimizerSlices()
    const {
  std::vector<std::vector<Slice>> out;
  if (options_.zeroStage == 0) {
    for (const Param& p : params_) out.push_back({Slice{p.name, 0, p.tensor.numel(), 0}});
    return out;
  }
  for (const Bucket& b : buckets_) {
    const int64_t chunk = b.padded / comm_.worldSize;
    const int64_t begin = chunk * comm_.rank, end = begin + chunk;
    out.emplace_back();
    int64_t offset = 0;
    for (size_t k : b.params) {
      const Param& p = params_[k];
      const int64_t n = p.tensor.numel();
      const int64_t from = std::max(begin, offset), to = std::min(end, offset + n);
      if (from < to) out.back().push_back(Slice{p.name, from - offset, to - from, from - begin});
      offset += n;
    }
  }
  return out;
}

void DistributedDataParallel::launchReduceScatter(size_t k) {
  Bucket& b = buckets_[k];
  if (stagingInSharedMemory_) {
    reduceScatterInStaging(k);
    return;
  }
  // At most one bucket's full gradients in flight besides this one (and a
  // bucket without gradients in this step sends zeros).
  completeLaunched();
  allocateGradients(k);
  if (options_.zeroStage == 3) releaseWeights(b);  // its gradients are all in: its parameters are done with
  // Gloo in LibTorch 1.13 has no reduce-scatter: an all-to-all sends part j
  // of the bucket to rank j (the bytes of a ring reduce-scatter), and each
  // rank sums the N copies of its part it received, in rank order.
  b.received = detail::unitBuffer(b.padded, b.flat.options());
  noteUnitElements(b.padded);
  std::vector<int64_t> equalParts;
  b.work = comm_.pg->alltoall_base(b.received, b.flat, equalParts, equalParts);
  if (monitor::timeline() != nullptr) traceCompletion(b);
}

void DistributedDataParallel::completeReduceScatter(size_t k) {
  torch::NoGradGuard noGrad;
  Bucket& b = buckets_[k];
  // Added to what earlier micro-steps left; the full gradients are freed.
  at::Tensor own = b.part.mutable_grad();
  for (int r = 0; r < comm_.worldSize; ++r) own.add_(partOf(b.received, b.padded, comm_.worldSize, r));
  b.received = at::Tensor();
  noteUnitElements(-b.padded);
  releaseGradients(k);
}

void DistributedDataParallel::gatherParameters() {
  if (unitsInSharedMemory_) {
    // Stage 3 gathers each unit when it is next used, from the other
    // ranks' regions: no rank may read a part before its owner stepped it.
    comm::CollectiveWait waiting("barrier after the step (ZeRO stage 3, shared memory)");
    shm_->barrier(comm_.timeout);
    return;
  }
  if (options_.zeroStage == 0 || options_.zeroStage == 3 || comm_.worldSize == 1) return;
  torch::NoGradGuard noGrad;
  const auto wallStart = monitor::Timeline::Clock::now();
  if (shm_ != nullptr && plan_->exchange == Exchange::sharedMemory) {
    comm::CollectiveWait waiting("parameter allgather (shared memory)");
    for (Bucket& b : buckets_) {
      shm_->allgather(weightsShmOffset_ + b.shmOffset, static_cast<size_t>(b.padded), comm_.timeout);
    }
  } else {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (Bucket& b : buckets_) {
      std::vector<at::Tensor> in{b.part.detach().clone()};
      std::vector<std::vector<at::Tensor>> out(1);
      for (int r = 0; r < comm_.worldSize; ++r) {
        out[0].push_back(partOf(b.weights, b.padded, comm_.worldSize, r));
      }
      works.push_back(comm_.pg->allgather(out, in));
    }
    if (std::exception_ptr failure = waitAll(std::move(works), "parameter allgather")) {
      std::rethrow_exception(failure);
    }
  }
  if (monitor::Timeline* t = monitor::timeline()) {
    t->complete("parameter allgather", "comm", wallStart, monitor::Timeline::Clock::now(), 0,
                fmt::format(R"({{"bytes":{}}})", totalFloats_ * 4));
  }
}

double DistributedDataParallel::gradientSquaredNorm() {
  torch::NoGradGuard noGrad;
  double sum = 0;
  for (const at::Tensor& g : ownGradientTensors()) {
    // A gradient autograd left in a parameter's layout (one rank, no
    // buckets) is dense but maybe not contiguous: dot() takes vectors.
    const at::Tensor flat = g.is_contiguous() ? g.view(-1) : g.contiguous().view(-1);
    sum += flat.dot(flat).item<double>();
  }
  if (options_.zeroStage < 2 || comm_.worldSize == 1) return sum;
  at::Tensor total = torch::full({1}, sum, torch::kDouble);
  comm::allreduceSum(comm_, total, "gradient norm");
  return total.item<double>();
}

void DistributedDataParallel::scaleGradients(double factor) {
  torch::NoGradGuard noGrad;
  for (at::Tensor& g : ownGradientTensors()) g.mul_(factor);
}

std::vector<at::Tensor> DistributedDataParallel::ownGradientTensors() const {
  std::vector<at::Tensor> out;
  if (withoutBuckets_) {
    for (const Param& p : params_) {
      if (p.tensor.grad().defined()) out.push_back(p.tensor.grad());
    }
    return out;
  }
  for (const Bucket& b : buckets_) out.push_back(ownGradients(b));
  return out;
}

}  // namespace cohort::parallel
