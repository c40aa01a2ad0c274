#pragma once

// Hugging Face's Llama layout (transformers' LlamaForCausalLM) and cohort's
// llama: the same tensors under the same names and shapes (models/llama.h),
// so only config.json needs translating. A tied head is not in the files
// (transformers ties lm_head.weight to model.embed_tokens.weight on load).
// docs/models.md, "Hugging Face Llama".

#include <nlohmann/json.hpp>
#include <string>

#include "cohort/ckpt/state_dict.h"
#include "cohort/models/llama.h"

namespace cohort::models {

// config.json of a model of `o`, as transformers writes it for LlamaForCausalLM.
nlohmann::json hfLlamaConfig(const LlamaOptions& o);

// The model a Llama config.json describes (model_type llama, hidden_act
// silu, no biases). Throws DataError naming `origin` and the key.
LlamaOptions llamaOptionsOf(const nlohmann::json& config, const std::string& origin);

// Checks `theirs` (llamaOptionsOf a config.json at `origin`) against the
// model the job builds, `ours` (vocab_size only when ours.vocabSize > 0).
// Throws DataError naming the file, the key, its value and the model.* key
// to set.
void checkHfLlamaConfig(const LlamaOptions& theirs, const LlamaOptions& ours, const std::string& origin);

// Checks the tensors `entries` (of the weights at `weights`) against the
// shapes config.json (at `origin`, giving `o`) implies. Throws DataError
// naming config.json, the key that gives the shape, the tensor and both
// shapes.
void checkHfLlamaShapes(const LlamaOptions& o, const ckpt::StateDict& entries, const std::string& origin,
                        const std::string& weights);

}  // namespace cohort::models
