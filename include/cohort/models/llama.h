#pragma once

// A Llama-family decoder (Llama 2 and 3, Mistral, TinyLlama, SmolLM): token
// embeddings, pre-RMSNorm blocks of causal self-attention with rotary
// position embeddings and grouped-query attention (n_kv_head key/value
// heads, each read by n_head / n_kv_head query heads), a SwiGLU MLP
// (down(silu(gate(x)) * up(x))), a final RMSNorm and an output head, tied
// to the token embedding or not. No biases. Its forward maps tokens [B, T]
// (int64, T <= block_size) to logits [B, T, vocab_size].
//
// Parameter names are Hugging Face's LlamaForCausalLM's
// (model.embed_tokens, model.layers.<n>.self_attn.q_proj, ..., lm_head), and
// so is the rotary convention (each head's dimensions rotated in two halves,
// rotate_half): a Hugging Face Llama checkpoint loads unchanged
// (models/hf_llama.h). The initialization is Hugging Face's: normal(0,
// 0.02) for every Linear and embedding, RMSNorm weights one.
//
// model.arch: llama builds it from the job's model.* keys (llamaOptions).

#include <cstdint>
#include <memory>

#include "cohort/models/model.h"

namespace cohort::models {

struct LlamaOptions {
  int64_t vocabSize = 256;
  int64_t blockSize = 256;
  int64_t nLayer = 4;
  int64_t nHead = 4;
  int64_t nKvHead = 4;        // divides nHead
  int64_t nEmbd = 128;        // divisible by nHead; head_dim = nEmbd / nHead, even
  int64_t intermediate = 384;  // the MLP's width
  double normEps = 1e-5;
  bool tiedHead = false;
  double dropout = 0.0;  // attention weights and residual branches
  bool recompute = false;
  RopeConfig rope;
};

// The name of the untied output head, and what it is when tied.
inline constexpr const char* kLlamaHeadName = "lm_head.weight";
inline constexpr const char* kLlamaEmbeddingName = "model.embed_tokens.weight";

// The options model.* give; `vocabSize` replaces model.vocab_size when
// that is 0. intermediate_size 0 gives 8/3 n_embd rounded up to 64.
LlamaOptions llamaOptions(const ModelConfig& config, int64_t vocabSize);

// The inverse frequencies [head_dim / 2] of the rotary embedding (float32,
// as Hugging Face computes them), with `rope`'s scaling.
at::Tensor ropeInverseFrequencies(int64_t headDim, const RopeConfig& rope);

// Throws ConfigError naming the model.* key when the options (or `part`)
// cannot work.
void checkLlamaOptions(const LlamaOptions& options, const ModelPart& part = {});

// Throws as checkLlamaOptions. `part`: only those blocks (models/model.h).
std::shared_ptr<Model> createLlama(const LlamaOptions& options, const ModelPart& part = {});

}  // namespace cohort::models
