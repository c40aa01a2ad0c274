#pragma once

// Hugging Face's GPT-2 layout (transformers' GPT2LMHeadModel) and cohort's
// gpt, both ways. The two hold the same tensors under the same names but
// for three things:
//   - Hugging Face's Conv1D stores a linear map's weight as [in, out]: the
//     c_attn, c_proj and c_fc weights of each block are transposed;
//   - each block has the causal mask as buffers, attn.bias (and in older
//     files attn.masked_bias), which cohort builds instead;
//   - a GPT2Model file (the published "gpt2") has no "transformer." prefix,
//     and no file holds lm_head.weight when it is tied to wte.
// Its config.json names the sizes (n_layer, n_head, n_embd, n_positions,
// vocab_size) and activation_function: gelu_new is model.activation
// gelu_tanh. docs/models.md, "Hugging Face GPT-2".

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cohort/ckpt/state_dict.h"
#include "cohort/config/job.h"
#include "cohort/models/gpt.h"

namespace cohort::models {

// Whether `entries` (a file's names and shapes) are in Hugging Face's
// layout: a block's c_attn weight stored [n_embd, 3 n_embd], or the mask
// buffers, or GPT2Model's names (h.0..., wte.weight).
bool isHfGpt2(const ckpt::StateDict& entries);

// `hf` in cohort's names and shapes: the Conv1D weights transposed as they
// are loaded, the mask buffers left out (cohort builds its own), the
// "transformer." prefix added where it is missing. `origin` names the file
// in errors.
std::unique_ptr<ckpt::TensorSource> hfGpt2AsCohort(std::unique_ptr<ckpt::TensorSource> hf, std::string origin);

// Whether cohort's tensor `name` is stored transposed in Hugging Face's
// layout (a block's attn.c_attn, attn.c_proj, mlp.c_fc or mlp.c_proj weight).
bool hfTransposed(const std::string& name);

// config.json of a model of `o` with `activation`, as transformers writes
// it for GPT2LMHeadModel (tied head, layer_norm_epsilon 1e-5).
nlohmann::json hfGpt2Config(const GptOptions& o, Activation activation);

// Checks a config.json against the model the job builds: model_type gpt2,
// the sizes (vocab_size only when `o.vocabSize` > 0), the activation and
// the LayerNorm epsilon. Throws DataError naming `origin`, the key, its
// value and the model.* key to set.
void checkHfGpt2Config(const nlohmann::json& config, const GptOptions& o, Activation activation,
                       const std::string& origin);

}  // namespace cohort::models
