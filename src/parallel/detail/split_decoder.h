#pragma once

// What the decoders split over a tensor group (tensor_gpt.cc,
// tensor_llama.cc) share: drawing the whole model's random numbers a
// bounded piece at a time and keeping only this rank's slice of each
// tensor, and a base model that holds the group, runs the blocks (ZeRO-3
// units, recomputed in backward with model.recompute), computes the head
// from the vocabulary's slices and the loss from the logits' slices.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/comm/comm.h"
#include "cohort/models/model.h"
#include "cohort/parallel/tensor_model.h"

namespace cohort::comm {
class ShmAllreduce;
}

namespace cohort::parallel::detail {

using Generator = c10::optional<at::Generator>;

// What normal_(0, std) on a contiguous float32 tensor of `sizes` draws
// from `gen`, of which only rank `rank`'s slice under `cut` of `tensors`
// ranks is kept and returned (a new tensor of the slice's shape); with
// `held` false everything is drawn and dropped (an undefined tensor). At
// most a piece of 2^18 numbers is held at once besides the slice.
at::Tensor drawSlice(const std::vector<int64_t>& sizes, double std, const TensorCut& cut, int tensors, int rank,
                     bool held, const Generator& gen);

// What building nn::Linear(in, out) and nn::Embedding(n, dim) with their
// default initialization draws, without keeping it.
void drawLinearDefaults(int64_t in, int64_t out, bool bias, const Generator& gen);
void drawEmbeddingDefaults(int64_t n, int64_t dim, const Generator& gen);

// A module that only holds a tensor: "weight" (the GPT's wpe, Llama's head).
class HolderImpl : public torch::nn::Module {
 public:
  explicit HolderImpl(at::Tensor w) : weight(register_parameter("weight", std::move(w))) {}
  at::Tensor weight;
};
TORCH_MODULE(Holder);

// A decoder's split model: the subclass builds its modules (through
// slice(), with the generator's numbers in the whole model's order) and
// its forward from checkInput, runBlocks and head.
class SplitDecoder : public TensorParallelModel {
 public:
  ~SplitDecoder() override;

  int64_t vocabFirst() const override { return vocabFirst_; }
  bool sequenceParallel() const override { return sequence_; }
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) override;
  // ZeRO stage 3 gathers one held block at a time.
  std::vector<std::string> shardingUnits() const override;

  // The group's exchanges through shared memory when `split` asks for it
  // and its ranks share a machine, for as long as this model lives.
  // Collective over the group (when T > 1).
  void startExchanges(const TensorSplitOptions& split);

 protected:
  // `arch`: the model's name in messages; `blocksPrefix`: its blocks'
  // names ("transformer.h."), each block a sharding unit.
  SplitDecoder(const comm::Comm& group, const models::ModelPart& part, const TensorSplitOptions& split,
               const Generator& gen, int64_t vocabSize, int64_t blockSize, int64_t width, bool recompute,
               std::string arch, std::string blocksPrefix);

  // This rank's slice of the whole model's tensor `name` of `sizes`,
  // drawn normal(0, std) in turn (drawSlice, cut by tensorCut(name));
  // undefined (drawn and dropped) when this part does not hold it.
  at::Tensor slice(const std::string& name, const std::vector<int64_t>& sizes, double std, bool held = true);

  // The input's sequence length, after checking tokens [B, S] (the first
  // stage) or the residual stream [B, S, width] (a later one): DataError
  // naming the model otherwise, or when S exceeds model.block_size.
  int64_t checkInput(const at::Tensor& in) const;

  // x through the held blocks in order, `block(k, x)` running the k-th:
  // each a ZeRO-3 unit, run again in backward with model.recompute (its
  // exchanges too, in the same order on every rank of the group). `block`
  // is kept by the recomputation until backward.
  using BlockForward = std::function<at::Tensor(size_t k, const at::Tensor& x)>;
  at::Tensor runBlocks(at::Tensor x, const BlockForward& block);

  // The input of column-parallel layers from the residual region's x:
  // whole on every rank (copyToSlices), or gathered from the sequence's
  // slices with sequence parallelism.
  at::Tensor columnInput(const at::Tensor& x) const;
  // The logits' slice [B, S, V/T] of the final norm's x by this rank's
  // rows of the head `weight` [V/T, C].
  at::Tensor head(const at::Tensor& x, const at::Tensor& weight) const;

  // Of `names` (the whole model's), those split, with their cuts.
  static std::vector<std::pair<std::string, TensorCut>> splitOf(const std::vector<std::string>& names);

  comm::Comm group_;
  models::ModelPart part_;
  Generator gen_;
  bool sequence_;
  int64_t vocabFirst_;
  std::vector<int64_t> blockIndex_;  // each held block's index in the whole model

 private:
  int64_t blockSize_, width_;
  bool recompute_;
  std::string arch_, blocksPrefix_;
  std::shared_ptr<comm::ShmAllreduce> segment_;
};

}  // namespace cohort::parallel::detail
