#pragma once

// What every decoder split over a tensor group the Megatron-LM way shares
// (docs/parallelism.md): the cut of each whole-model tensor, the split
// model's interface to the plans (the loss from the vocabulary's slices,
// the cuts a checkpoint records), and the whole model put back together
// from the slices. The splits themselves: parallel/tensor_gpt.h (the GPT)
// and parallel/tensor_llama.h (the Llama family).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/comm/comm.h"
#include "cohort/models/model.h"

namespace cohort::parallel {

// How a tensor of the whole model is cut over T ranks: along `dim`, which
// is `blocks` equal blocks (the GPT's c_attn: query, key and value) each cut
// in T (rank r takes slice r of every block); dim -1: whole on every rank.
struct TensorCut {
  int dim = -1;
  int blocks = 1;
  bool split() const { return dim >= 0; }
};

// The cut of the whole model's tensor `name`, by its name: the GPT's
// (nanoGPT's names, transformer.*) and the Llama family's (Hugging Face's,
// model.* and lm_head); the head lm_head.weight is cut by the vocabulary
// in both. Any other name is whole.
TensorCut tensorCut(const std::string& name);

// Rank `rank`'s slice of `whole` (the whole model's tensor) under `cut` of
// `tensors` ranks: a new contiguous tensor.
at::Tensor sliceByCut(const at::Tensor& whole, const TensorCut& cut, int tensors, int rank);

// The whole tensor of `slices`, each rank's slice under `cut` in rank
// order: what sliceByCut cut.
at::Tensor wholeFromSlices(const std::vector<at::Tensor>& slices, const TensorCut& cut);

// A model of which this rank holds its tensor group's slice: forward
// returns this rank's slice of the logits, [B, S, V/T], the columns
// [vocabFirst(), vocabFirst() + V/T) of the whole model's (or, on a
// pipeline stage before the last, the residual stream). Parameter names
// are the whole model's; only the shapes are the slices' (tensorCut).
class TensorParallelModel : public models::Model {
 public:
  virtual int64_t vocabFirst() const = 0;
  // Whether the norm and residual regions hold 1/T of the sequence
  // (TensorSplitOptions::sequenceParallel, with T > 1).
  virtual bool sequenceParallel() const = 0;
  // The mean cross-entropy of this rank's logits slice [B, S, V/T] against
  // `targets` [B, S] (whole-vocabulary ids). Collective over the group.
  virtual at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) = 0;
  // Every split tensor of the whole model (every stage's, not only this
  // part's) with its cut: what a checkpoint records (extra.tensor.cuts).
  virtual std::vector<std::pair<std::string, TensorCut>> wholeCuts() const = 0;
};

struct TensorSplitOptions {
  // Sequence parallelism (distribution.sequence_parallel): between the
  // column/row pairs (the norms, the residual stream, the embeddings) each
  // rank holds 1/T of the sequence; the sums around the pairs become an
  // all-gather before and a reduce-scatter after (gatherSequence,
  // reduceScatterSequence). The sequence length must then be divisible by
  // T (DataError otherwise).
  bool sequenceParallel = false;
  // > 0: when the group's ranks are on one machine, they exchange through
  // a shared memory segment of this many floats per rank (the largest
  // activation a sum carries; bigger ones go in pieces) instead of Gloo.
  // Collective over the group when set (distribution.shared_memory).
  int64_t sharedMemoryFloats = 0;
};

// The whole model's tensors from a model split over `group` (state dict
// order, tensorCut naming the cuts): on the group's rank 0, `visit` sees
// each tensor whole, a split one gathered from the group's slices one
// tensor at a time (Gloo's gather: the other ranks only send), so that rank
// 0 holds its own slices and one whole tensor besides. Collective over the
// group; the other ranks visit nothing.
void visitWholeTensors(const models::Model& model, const comm::Comm& group,
                       const std::function<void(const std::string&, const at::Tensor&)>& visit);
// The same over `slices` (each rank's tensors of one state dict, in one
// order: models::publishedStateDict of the split model).
void visitWholeTensors(const ckpt::StateDict& slices, const comm::Comm& group,
                       const std::function<void(const std::string&, const at::Tensor&)>& visit);

}  // namespace cohort::parallel
