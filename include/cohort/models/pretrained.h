#pragma once

// Weights from outside a run (model.init_from, `cohort serve FILE --job`):
// cohort's own files, and Hugging Face's model directories.

#include <memory>
#include <string>

#include "cohort/ckpt/state_dict.h"
#include "cohort/config/job.h"

namespace cohort::models {

// Weights in any layout cohort reads: a .pt or .safetensors file in
// cohort's names (ckpt/weights.h); for model.arch gpt also Hugging Face's
// GPT-2 layout (models/hf_gpt2.h), for llama its Llama layout
// (models/hf_llama.h): a directory holding config.json (checked against
// the job) and model.safetensors, a sharded model.safetensors.index.json
// with its shards, or pytorch_model.bin (or its index), or such a file
// alone. Tensors are read one at a time, from whichever shard holds them.
// Throws DataError naming the file.
std::unique_ptr<ckpt::TensorSource> openPretrained(const std::string& path, const ModelConfig& config);

// The tensors of a sharded Hugging Face checkpoint: the index file
// (model.safetensors.index.json) maps each tensor to its shard beside it.
// Only the shards' headers are read here; a tensor's data when loaded.
// Throws DataError naming the index, the tensor and the shard when a shard
// is missing or lacks a tensor the index puts in it.
std::unique_ptr<ckpt::TensorSource> openShardedWeights(const std::string& index);

}  // namespace cohort::models
