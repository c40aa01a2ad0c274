// Tensor parallelism's layers and exchanges (parallel/tensor_layers.h).

#include "cohort/models/linear.h"
#include "cohort/parallel/tensor_layers.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <mutex>

#include "cohort/comm/shm.h"
#include "cohort/core/error.h"

namespace cohort::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through autograd's context as its address: the module
// (or the caller) that owns it outlives the graph's backward.
void keep(AutogradContext* ctx, const comm::Comm* group) {
  ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
}
const comm::Comm& groupOf(AutogradContext* ctx) {
  return *reinterpret_cast<const comm::Comm*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

thread_local TensorExchanges exchanges;

// The groups that exchange through shared memory, by process group.
std::mutex segmentsMutex;
std::map<const void*, std::shared_ptr<comm::ShmAllreduce>>& segments() {
  static std::map<const void*, std::shared_ptr<comm::ShmAllreduce>> bySegment;
  return bySegment;
}
std::shared_ptr<comm::ShmAllreduce> segmentOf(const comm::Comm& group) {
  std::lock_guard<std::mutex> g(segmentsMutex);
  auto it = segments().find(group.pg.get());
  return it == segments().end() ? nullptr : it->second;
}

// The sum of `t` (contiguous float32) over the segment's ranks, in place,
// a region's worth at a time.
void sumThrough(comm::ShmAllreduce& shm, at::Tensor& t, const comm::Comm& group) {
  float* data = t.data_ptr<float>();
  const size_t n = static_cast<size_t>(t.numel()), cap = shm.floatsPerRank();
  for (size_t at = 0; at < n; at += cap) {
    const size_t len = std::min(cap, n - at);
    std::memcpy(shm.region(), data + at, len * sizeof(float));
    shm.allreduce(0, len, group.timeout);
    std::memcpy(data + at, shm.region(), len * sizeof(float));
  }
}

// Every rank's `x` (contiguous float32, the same size on each) through the
// segment, in rank order.
std::vector<at::Tensor> gatherThrough(comm::ShmAllreduce& shm, const at::Tensor& x, const comm::Comm& group) {
  const size_t n = static_cast<size_t>(x.numel()), ranks = static_cast<size_t>(group.worldSize);
  const size_t cap = shm.floatsPerRank() / ranks;
  std::vector<at::Tensor> out;
  for (size_t r = 0; r < ranks; ++r) out.push_back(at::empty_like(x));
  const float* src = x.data_ptr<float>();
  const size_t own = static_cast<size_t>(group.rank);
  for (size_t at = 0; at < n; at += cap) {
    const size_t len = std::min(cap, n - at);
    std::memcpy(shm.region() + own * len, src + at, len * sizeof(float));
    shm.allgather(0, len * ranks, group.timeout);
    for (size_t r = 0; r < ranks; ++r) {
      std::memcpy(out[r].data_ptr<float>() + at, shm.region() + r * len, len * sizeof(float));
    }
  }
  return out;
}

void sumInPlace(const comm::Comm& group, at::Tensor& t, const char* what) {
  if (group.worldSize == 1) return;
  ++exchanges.sums;
  exchanges.sumBytes += static_cast<int64_t>(t.nbytes());
  const bool narrow = t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  if (auto shm = segmentOf(group); shm && (narrow || t.scalar_type() == at::kFloat) && t.is_cpu()) {
    at::Tensor wide = narrow || !t.is_contiguous() ? t.to(at::kFloat).contiguous() : t;
    sumThrough(*shm, wide, group);
    if (!wide.is_same(t)) t.copy_(wide);
    return;
  }
  if (narrow) {
    // Gloo has no bfloat16 sum: summed in float32 and rounded once, as the
    // gradient exchange's bf16 compression sums.
    at::Tensor wide = t.to(at::kFloat);
    comm::allreduceSum(group, wide, what);
    t.copy_(wide);
    return;
  }
  comm::allreduceSum(group, t, what);
}

at::Tensor summed(const at::Tensor& x, const comm::Comm& group, const char* what) {
  at::Tensor t = x.contiguous().clone();
  sumInPlace(group, t, what);
  return t;
}

void maxInPlace(const comm::Comm& group, at::Tensor& t, const char* what) {
  if (group.worldSize == 1) return;
  ++exchanges.sums;
  exchanges.sumBytes += static_cast<int64_t>(t.nbytes());
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  comm::wait(group.pg->allreduce(v, o), group, what);
}

struct CopyToSlices : torch::autograd::Function<CopyToSlices> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm::Comm* group) {
    keep(ctx, group);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {summed(grads[0], groupOf(ctx), "tensor-parallel input gradient sum"), at::Tensor()};
  }
};

struct SumOfSlices : torch::autograd::Function<SumOfSlices> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const comm::Comm* group) {
    return summed(x, *group, "tensor-parallel output sum");
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

std::vector<at::Tensor> allGathered(const at::Tensor& x, const comm::Comm& group, const char* what) {
  const bool bits = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  if (auto shm = segmentOf(group); shm && (bits || x.scalar_type() == at::kFloat) && x.is_cpu()) {
    ++exchanges.gathers;
    exchanges.gatherBytes += static_cast<int64_t>(x.nbytes());
    std::vector<at::Tensor> out = gatherThrough(*shm, x.to(at::kFloat).contiguous(), group);
    if (bits) {
      for (at::Tensor& t : out) t = t.to(x.scalar_type());
    }
    return out;
  }
  // 16-bit floating types travel as their bits (Gloo gathers no bfloat16).
  std::vector<at::Tensor> in{bits ? x.contiguous().view(at::kShort) : x.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < group.worldSize; ++r) out[0].push_back(at::empty_like(in[0]));
  ++exchanges.gathers;
  exchanges.gatherBytes += static_cast<int64_t>(in[0].nbytes());
  comm::wait(group.pg->allgather(out, in), group, what);
  if (bits) {
    for (at::Tensor& t : out[0]) t = t.view(x.scalar_type());
  }
  return out[0];
}

at::Tensor gathered(const at::Tensor& x, int64_t dim, const comm::Comm& group, const char* what) {
  return torch::cat(allGathered(x, group, what), dim);
}

at::Tensor scattered(const at::Tensor& x, int64_t dim, const comm::Comm& group, const char* what) {
  const int64_t width = x.size(dim) / group.worldSize;
  return summed(x, group, what).narrow(dim, width * group.rank, width).contiguous();
}

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, const comm::Comm* group) {
    keep(ctx, group);
    ctx->saved_data["dim"] = dim;
    return gathered(x, dim, *group, "sequence-parallel all-gather");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {scattered(grads[0], ctx->saved_data["dim"].toInt(), groupOf(ctx), "sequence-parallel gradient sum"),
            at::Tensor(), at::Tensor()};
  }
};

// A column-parallel layer on this rank's part of the sequence: the parts
// gathered, then the layer. Only the part is kept for backward (the whole
// input, T times larger, is gathered again there), so that sequence
// parallelism's activations are 1/T.
struct GatheredLinear : torch::autograd::Function<GatheredLinear> {
  // The product without the bias (the caller adds it: an undefined input
  // cannot pass through a custom function).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, int64_t dim,
                            const comm::Comm* group) {
    keep(ctx, group);
    ctx->saved_data["dim"] = dim;
    at::Tensor y = models::linear(gathered(x, dim, *group, "sequence-parallel all-gather"), weight);
    // The product's type (bf16 under autocast), for backward.
    ctx->saved_data["dtype"] = static_cast<int64_t>(y.scalar_type());
    ctx->save_for_backward({x, weight});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const auto type = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor g = grads[0].to(type);
    const at::Tensor whole = gathered(x, dim, groupOf(ctx), "sequence-parallel all-gather (backward)").to(type);
    const at::Tensor g2 = g.reshape({-1, g.size(-1)});
    const at::Tensor gw = g2.t().matmul(whole.reshape({-1, whole.size(-1)})).to(weight.scalar_type());
    const at::Tensor gx = scattered(g.matmul(weight.to(type)), dim, groupOf(ctx), "sequence-parallel gradient sum")
                              .to(x.scalar_type());
    return {gx, gw, at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, const comm::Comm* group) {
    keep(ctx, group);
    ctx->saved_data["dim"] = dim;
    return scattered(x, dim, *group, "sequence-parallel output sum");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gathered(grads[0], ctx->saved_data["dim"].toInt(), groupOf(ctx), "sequence-parallel gradient all-gather"),
            at::Tensor(), at::Tensor()};
  }
};

struct VocabCrossEntropy : torch::autograd::Function<VocabCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            int64_t first, const comm::Comm* group) {
    const at::Tensor x = logits.to(torch::kFloat32);
    const int64_t n = x.size(0), width = x.size(1);
    // Each row's maximum over the whole vocabulary, for a stable exponent.
    at::Tensor top = std::get<0>(x.max(1)).contiguous();
    maxInPlace(*group, top, "tensor-parallel cross-entropy maximum");
    const at::Tensor shifted = x - top.unsqueeze(1);
    const at::Tensor e = shifted.exp();
    at::Tensor total = e.sum(1).contiguous();
    sumInPlace(*group, total, "tensor-parallel cross-entropy sum of exponentials");
    // The target's logit, from the rank whose columns hold it.
    at::Tensor local = target.to(torch::kLong) - first;
    const at::Tensor outside = (local < 0).logical_or(local >= width);
    local = local.masked_fill(outside, 0);
    at::Tensor picked = shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0).contiguous();
    sumInPlace(*group, picked, "tensor-parallel cross-entropy target logits");
    ctx->save_for_backward({e / total.unsqueeze(1), local, outside});
    ctx->saved_data["type"] = static_cast<int64_t>(logits.scalar_type());
    return (total.log() - picked).sum() / static_cast<double>(n);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local = saved[1];
    const at::Tensor& outside = saved[2];
    // d(mean loss)/d(logit) = (softmax - one-hot of the target) / N.
    at::Tensor g = softmax.clone();
    const at::Tensor hit = outside.logical_not().to(torch::kFloat32).neg();
    g.scatter_add_(1, local.unsqueeze(1), hit.unsqueeze(1));
    g.mul_(grads[0] / static_cast<double>(softmax.size(0)));
    const auto type = static_cast<at::ScalarType>(ctx->saved_data["type"].toInt());
    return {g.to(type), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void useSharedMemory(const comm::Comm& group, std::shared_ptr<comm::ShmAllreduce> segment) {
  std::lock_guard<std::mutex> g(segmentsMutex);
  segments()[group.pg.get()] = std::move(segment);
}

void stopSharedMemory(const comm::Comm& group) {
  std::lock_guard<std::mutex> g(segmentsMutex);
  segments().erase(group.pg.get());
}

TensorExchanges& tensorExchanges() { return exchanges; }

at::Tensor copyToSlices(const at::Tensor& x, const comm::Comm& group) {
  if (group.worldSize == 1) return x;
  return CopyToSlices::apply(x, &group);
}

at::Tensor sumOfSlices(const at::Tensor& x, const comm::Comm& group) {
  if (group.worldSize == 1) return x;
  return SumOfSlices::apply(x, &group);
}

at::Tensor gatherSequence(const at::Tensor& x, int64_t dim, const comm::Comm& group) {
  if (group.worldSize == 1) return x;
  return GatherSequence::apply(x, dim, &group);
}

at::Tensor reduceScatterSequence(const at::Tensor& x, int64_t dim, const comm::Comm& group) {
  if (group.worldSize == 1) return x;
  if (x.size(dim) % group.worldSize != 0) {
    throw DataError(fmt::format("sequence parallelism over {} ranks: a sequence of {} positions is not divisible "
                                "by {}",
                                group.worldSize, x.size(dim), group.worldSize));
  }
  return ReduceScatterSequence::apply(x, dim, &group);
}

at::Tensor sliceOf(const at::Tensor& whole, int64_t dim, int parts, int index) {
  const int64_t size = whole.size(dim);
  if (parts <= 0 || size % parts != 0) {
    throw ConfigError(fmt::format("a tensor of shape [{}] cannot be cut into {} equal slices along dimension {}",
                                  fmt::join(whole.sizes(), ", "), parts, dim));
  }
  const int64_t width = size / parts;
  return whole.narrow(dim, width * index, width).contiguous().clone();
}

SplitLinearImpl::SplitLinearImpl(at::Tensor w, at::Tensor b, comm::Comm group) : group_(std::move(group)) {
  weight = register_parameter("weight", std::move(w));
  if (b.defined()) bias = register_parameter("bias", std::move(b));
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  return models::linear(copyToSlices(x, group_), weight, bias);
}

at::Tensor ColumnParallelLinearImpl::forwardGathered(const at::Tensor& x, int64_t dim) {
  if (group_.worldSize == 1) return models::linear(x, weight, bias);
  const at::Tensor y = GatheredLinear::apply(x, weight, dim, &group_);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;  // in the product's type, as linear adds it
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = sumOfSlices(models::linear(x, weight), group_);
  return bias.defined() ? y + bias : y;
}

at::Tensor RowParallelLinearImpl::forwardScattered(const at::Tensor& x, int64_t dim) {
  at::Tensor y = reduceScatterSequence(models::linear(x, weight), dim, group_);
  return bias.defined() ? y + bias : y;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(at::Tensor w, int64_t first, comm::Comm group)
    : first_(first), group_(std::move(group)) {
  weight = register_parameter("weight", std::move(w));
}

at::Tensor VocabParallelEmbeddingImpl::lookup(const at::Tensor& tokens) {
  at::Tensor local = tokens - first_;
  const at::Tensor outside = (local < 0).logical_or(local >= weight.size(0));
  local = local.masked_fill(outside, 0);
  return torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& tokens) {
  return sumOfSlices(lookup(tokens), group_);
}

at::Tensor VocabParallelEmbeddingImpl::forwardScattered(const at::Tensor& tokens, int64_t dim) {
  return reduceScatterSequence(lookup(tokens), dim, group_);
}

at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target, int64_t first,
                                     const comm::Comm& group) {
  COHORT_ASSERT(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
                "vocab-parallel cross-entropy takes logits [N, V/T] and targets [N]");
  return VocabCrossEntropy::apply(logits, target, first, &group);
}

}  // namespace cohort::parallel
