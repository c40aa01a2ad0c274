#pragma once

// The GPT (models/gpt.h) split over a tensor group the Megatron-LM way
// (docs/parallelism.md): each of the group's T ranks holds
//
//   transformer.wte.weight         rows [r V/T, (r+1) V/T): vocab-parallel, the
//                                  embedding and the tied head
//   attn.c_attn.weight, .bias      the query, key and value rows of heads
//                                  [r H/T, (r+1) H/T): column-parallel
//   attn.c_proj.weight             columns of those heads: row-parallel
//   mlp.c_fc.weight, .bias         rows [r 4C/T, ...): column-parallel
//   mlp.c_proj.weight              those columns: row-parallel
//   the rest                       whole (wpe, the LayerNorms, the row-parallel
//                                  layers' biases)
//
// so that a block's forward makes one sum over the group after attention
// and one after the MLP (and one each in backward), and the loss is
// computed from the logits' slices (vocabParallelCrossEntropy), never whole.
//
// The slices are built with the values the whole model of the same seed
// has, bitwise: every random number the whole model draws is drawn, in its
// order, a bounded piece at a time, and only this rank's slice of each
// tensor is kept; no rank holds a whole weight matrix of a split layer.
// Parameter names are the whole model's; only the shapes are the slices'.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cohort/ckpt/state_dict.h"
#include "cohort/comm/comm.h"
#include "cohort/models/gpt.h"
#include "cohort/models/model.h"

namespace cohort::parallel {

// How a tensor of the whole GPT is cut over T ranks: along `dim`, which is
// `blocks` equal blocks (c_attn's query, key and value) each cut in T
// (rank r takes slice r of every block); dim -1: whole on every rank.
struct TensorCut {
  int dim = -1;
  int blocks = 1;
  bool split() const { return dim >= 0; }
};

// The cut of the whole GPT's tensor `name` (nanoGPT's names).
TensorCut gptTensorCut(const std::string& name);

// Rank `rank`'s slice of `whole` (the whole model's tensor) under `cut` of
// `tensors` ranks: a new contiguous tensor.
at::Tensor sliceByCut(const at::Tensor& whole, const TensorCut& cut, int tensors, int rank);

// Throws ConfigError naming the key when `tensors` ranks cannot split the
// GPT of `o`: T must divide model.n_head, the MLP's width (4 n_embd) and
// model.vocab_size; model.dropout is refused (not supported split yet).
// model.recompute runs each block again in backward, its exchanges too.
void checkGptTensorSplit(const models::GptOptions& o, int tensors);

// This rank's part of the GPT of `o`, split over `group` (its rank and
// size: the tensor rank and T). forward(tokens [B, S]) returns this rank's
// slice of the logits, [B, S, V/T]: the columns [vocabFirst(), vocabFirst()
// + V/T) of the whole model's. loss() turns them into the mean
// cross-entropy, the same on every rank of the group. The group must
// outlive the model's backward passes. The numbers are drawn from
// `generator` (the default CPU generator when none), as the whole model
// draws them from the default one. `part`: a pipeline stage's blocks (and
// the embeddings on the first stage, the final norm and the head on the
// last), every number of the other stages drawn and dropped; a later
// stage's forward takes the residual stream [B, S, C] and an earlier one's
// returns it. Throws ConfigError as checkGptTensorSplit, and for sequence
// parallelism in a part.
class TensorParallelGpt : public models::Model {
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
  // column/row pairs (the LayerNorms, the residual stream, the
  // embeddings' sum) each rank holds 1/T of the sequence; the sums around
  // the pairs become an all-gather before and a reduce-scatter after
  // (gatherSequence, reduceScatterSequence). The sequence length must then
  // be divisible by T (DataError otherwise).
  bool sequenceParallel = false;
  // > 0: when the group's ranks are on one machine, they exchange through
  // a shared memory segment of this many floats per rank (the largest
  // activation a sum carries; bigger ones go in pieces) instead of Gloo.
  // Collective over the group when set (distribution.shared_memory).
  int64_t sharedMemoryFloats = 0;
};

std::shared_ptr<TensorParallelGpt> createTensorParallelGpt(const models::GptOptions& o, const comm::Comm& group,
                                                           TensorSplitOptions split = {},
                                                           c10::optional<at::Generator> generator = c10::nullopt,
                                                           const models::ModelPart& part = {});

// The whole tensor of `slices`, each rank's slice under `cut` in rank
// order: what sliceByCut cut.
at::Tensor wholeFromSlices(const std::vector<at::Tensor>& slices, const TensorCut& cut);

// The whole model's tensors from a model split over `group` (state dict
// order, gptTensorCut naming the cuts): on the group's rank 0, `visit` sees
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
