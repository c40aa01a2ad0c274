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
#include <c10/util/Optional.h>

#include <memory>

#include "cohort/comm/comm.h"
#include "cohort/models/gpt.h"
#include "cohort/models/model.h"
#include "cohort/parallel/tensor_model.h"

namespace cohort::parallel {

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
std::shared_ptr<TensorParallelModel> createTensorParallelGpt(const models::GptOptions& o, const comm::Comm& group,
                                                             TensorSplitOptions split = {},
                                                             c10::optional<at::Generator> generator = c10::nullopt,
                                                             const models::ModelPart& part = {});

}  // namespace cohort::parallel
