#pragma once

// Tensor parallelism's layers, Megatron-LM's split (docs/parallelism.md):
// the T ranks of a mesh's tensor group (Mesh::tensor) each hold a slice of
// a layer's weight and compute their part of it. The exchanges between the
// parts are autograd functions, so that backward makes the conjugate one:
//
//   copyToSlices(x)    forward x itself; backward the sum of the ranks'
//                      gradients (where a whole input enters split layers)
//   sumOfSlices(x)     forward the sum of the ranks' x; backward the
//                      gradient itself (where split outputs become whole)
//
// A column-parallel layer followed by a row-parallel one (attention's
// projections, the MLP's two layers) needs one sum in forward and one in
// backward:
//
//   x (whole) -> copyToSlices -> ColumnParallelLinear -> act -> RowParallelLinear -> y (whole)
//                                (rows of W1: out/T)           (columns of W2: in/T, one sum)
//
// The embedding and the head are split over the vocabulary: each rank
// holds V/T rows of the table, and the loss is computed from the logits'
// slices without forming the whole logits on any rank.
//
// Every module keeps a copy of `group` (its process group is shared), and
// the group must work for as long as the module computes. The functions
// keep the address of the `group` they are given for their backward: it
// must outlive the graph's backward (a member of the model, or the mesh).

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "cohort/comm/comm.h"

namespace cohort::comm {
class ShmAllreduce;
}

namespace cohort::parallel {

at::Tensor copyToSlices(const at::Tensor& x, const comm::Comm& group);
at::Tensor sumOfSlices(const at::Tensor& x, const comm::Comm& group);

// What this thread's tensor-parallel exchanges (all of this header's,
// forward and backward) have sent: sums (allreduce, of which a maximum
// too) and all-gathers, each counted once per call with the bytes of the
// tensor this rank puts in. A rank's forward and backward run on its
// training thread, so this is the rank's. Reset by assigning {}.
struct TensorExchanges {
  int64_t sums = 0, sumBytes = 0;
  int64_t gathers = 0, gatherBytes = 0;
};
TensorExchanges& tensorExchanges();

// The group's exchanges through `segment` (a shared memory segment among
// its ranks, all on one machine: parallel/detail/exchange.h) instead of
// Gloo, until stopSharedMemory(group): sums and all-gathers of float32 (and
// of bf16, widened), in pieces of the segment's size. Each rank of the
// group calls it with its own segment of the same one.
void useSharedMemory(const comm::Comm& group, std::shared_ptr<comm::ShmAllreduce> segment);
void stopSharedMemory(const comm::Comm& group);

// Sequence parallelism's exchanges, where each rank holds 1/T of the
// sequence (dimension `dim`) of what would be whole on every rank:
//
//   gatherSequence(x)         forward the ranks' slices put together along
//                             `dim` (all-gather); backward the sum of the
//                             ranks' gradients, this rank's slice of it
//   reduceScatterSequence(x)  forward the sum of the ranks' x, this rank's
//                             slice along `dim`; backward the gradient
//                             all-gathered
//
// They take the place of copyToSlices and sumOfSlices around a column/row
// pair: the same sums, the activations between the pairs 1/T. (Gloo has no
// reduce-scatter: the sum is an allreduce of which each rank keeps its
// slice.) `dim`'s size must be the same on every rank (and divisible by T
// for reduceScatterSequence).
at::Tensor gatherSequence(const at::Tensor& x, int64_t dim, const comm::Comm& group);
at::Tensor reduceScatterSequence(const at::Tensor& x, int64_t dim, const comm::Comm& group);

// Slice `index` of `parts` of `whole` along `dim`: a contiguous copy.
// Throws ConfigError when `parts` does not divide that dimension.
at::Tensor sliceOf(const at::Tensor& whole, int64_t dim, int parts, int index);

// A linear layer's slice as the split gives it: `weight` and `bias`
// (undefined: none) are registered as its parameters.
class SplitLinearImpl : public torch::nn::Module {
 public:
  at::Tensor weight, bias;

 protected:
  SplitLinearImpl(at::Tensor weight, at::Tensor bias, comm::Comm group);
  comm::Comm group_;
};

// y = x W^T + b with W's rows (the output features) split: this rank holds
// `weight` [out/T, in] and `bias` [out/T], takes x whole and gives its
// slice of y's last dimension.
class ColumnParallelLinearImpl : public SplitLinearImpl {
 public:
  ColumnParallelLinearImpl(at::Tensor weight, at::Tensor bias, comm::Comm group)
      : SplitLinearImpl(std::move(weight), std::move(bias), std::move(group)) {}
  at::Tensor forward(const at::Tensor& x);
  // With sequence parallelism: x is this rank's slice of the sequence
  // (dimension `dim`), gathered whole before the product; backward keeps
  // only the slice and gathers it again (as Megatron-LM does), so that the
  // activations held are 1/T.
  at::Tensor forwardGathered(const at::Tensor& x, int64_t dim);
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T + b with W's columns (the input features) split: this rank
// holds `weight` [out, in/T], takes its slice of x's last dimension and
// gives y whole, the same on every rank (one sum). `bias` [out] is whole on
// every rank, added once after the sum.
class RowParallelLinearImpl : public SplitLinearImpl {
 public:
  RowParallelLinearImpl(at::Tensor weight, at::Tensor bias, comm::Comm group)
      : SplitLinearImpl(std::move(weight), std::move(bias), std::move(group)) {}
  at::Tensor forward(const at::Tensor& x);
  // With sequence parallelism: y's sum over the ranks, this rank's slice of
  // the sequence (dimension `dim`), plus the bias.
  at::Tensor forwardScattered(const at::Tensor& x, int64_t dim);
};
TORCH_MODULE(RowParallelLinear);

// An embedding whose rows (the vocabulary) are split: this rank holds rows
// [first, first + rows) of the table. A token outside them looks up zeros
// here; the sum over the ranks is the lookup, whole on every rank.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(at::Tensor weight, int64_t first, comm::Comm group);
  at::Tensor forward(const at::Tensor& tokens);
  // With sequence parallelism: the lookup summed over the ranks, this rank's
  // slice of the sequence (dimension `dim` of the result).
  at::Tensor forwardScattered(const at::Tensor& tokens, int64_t dim);
  at::Tensor weight;
  int64_t first() const { return first_; }

 private:
  // This rank's rows of the lookup, zeros for tokens outside them.
  at::Tensor lookup(const at::Tensor& tokens);
  int64_t first_;
  comm::Comm group_;
};
TORCH_MODULE(VocabParallelEmbedding);

// The mean over N rows of -log softmax(logits)[target] where this rank
// holds `logits` [N, V/T], the columns [first, first + V/T) of the whole
// logits, and `target` [N] holds indices into the whole vocabulary. The
// same loss on every rank of the group; the gradient flows to each rank's
// slice only. Computed in float32 whatever the logits' type. Three sums
// over the group (the rows' maximum, their sums of exponentials, the target
// logits), each of N floats: the logits are never whole on any rank.
at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target, int64_t first,
                                     const comm::Comm& group);

}  // namespace cohort::parallel
