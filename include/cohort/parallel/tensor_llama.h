#pragma once

// The Llama-family decoder (models/llama.h) split over a tensor group the
// Megatron-LM way (docs/parallelism.md), as the GPT is (tensor_gpt.h):
// each of the group's T ranks holds
//
//   model.embed_tokens.weight       rows [r V/T, (r+1) V/T): vocab-parallel
//   lm_head.weight                  the same rows when untied (tied: the
//                                   embedding's): the head's logits slice
//   self_attn.q_proj.weight         the rows of query heads [r H/T, ...)
//   self_attn.k_proj, v_proj        the rows of key/value heads [r KV/T, ...):
//                                   column-parallel; the query heads a rank
//                                   holds read only the key/value heads it
//                                   holds (T divides n_kv_head)
//   self_attn.o_proj.weight         the columns of those query heads: row-parallel
//   mlp.gate_proj, up_proj          rows [r I/T, (r+1) I/T): column-parallel
//   mlp.down_proj.weight            those columns: row-parallel
//   the RMSNorms                    whole
//
// so that a block makes one sum over the group after attention and one
// after the MLP in forward (and one each in backward), the rotary
// embedding turns each rank's heads as the whole model turns them, and the
// loss comes from the logits' slices (vocabParallelCrossEntropy). The
// slices hold the whole model's values of the same seed, bitwise, drawn a
// piece at a time; no rank holds a whole split matrix.

#include <ATen/core/Generator.h>
#include <c10/util/Optional.h>

#include <memory>

#include "cohort/comm/comm.h"
#include "cohort/models/llama.h"
#include "cohort/models/model.h"
#include "cohort/parallel/tensor_model.h"

namespace cohort::parallel {

// Throws ConfigError naming the key when `tensors` ranks cannot split the
// Llama of `o`: T must divide model.n_kv_head (and so model.n_head),
// model.intermediate_size and model.vocab_size; model.dropout is refused.
void checkLlamaTensorSplit(const models::LlamaOptions& o, int tensors);

// This rank's part of the Llama of `o` split over `group`, as
// createTensorParallelGpt builds the GPT's (tensor_gpt.h): forward(tokens
// [B, S]) returns this rank's slice of the logits [B, S, V/T]; `part` a
// pipeline stage's blocks; sequence parallelism (`split`) gathers each
// block's input once for its three projections (and once for gate and up)
// and scatters o_proj's and down_proj's sums. Throws ConfigError as
// checkLlamaTensorSplit and createLlama, and for sequence parallelism in a part.
std::shared_ptr<TensorParallelModel> createTensorParallelLlama(const models::LlamaOptions& o,
                                                               const comm::Comm& group, TensorSplitOptions split = {},
                                                               c10::optional<at::Generator> generator = c10::nullopt,
                                                               const models::ModelPart& part = {});

}  // namespace cohort::parallel
