#pragma once

// A decoder-only transformer language model in GPT-2's layout: token and
// learned position embeddings, pre-LayerNorm blocks of causal multi-head
// self-attention and a GELU MLP, a final LayerNorm, and an output head tied
// to the token embedding. Its forward maps tokens [B, T] (int64, T <=
// block_size) to logits [B, T, vocab_size].
//
// Parameter names are nanoGPT's (transformer.wte, transformer.h.<n>.attn.
// c_attn, ...), and the initialization is GPT-2's: normal(0, 0.02), the
// residual projections scaled by 1 / sqrt(2 n_layer), biases zero.
// bench/peers/gpt.py is the same module in PyTorch.
//
// The output head is the embedding matrix itself and is registered once
// (transformer.wte.weight): the optimizer and the gradient exchange see the
// tensor once. PyTorch's state dict of the tied module also lists it as
// lm_head.weight (kTiedHeadName).
//
// model.arch: gpt builds it from the job's model.* keys (gptOptions).

#include <cstdint>
#include <functional>
#include <memory>

#include "cohort/models/model.h"

namespace cohort::models {

struct GptOptions {
  int64_t vocabSize = 256;  // byte-level tokens
  int64_t blockSize = 256;  // longest sequence (positions)
  int64_t nLayer = 4;
  int64_t nHead = 4;
  int64_t nEmbd = 128;      // divisible by nHead
  double dropout = 0.0;     // embeddings, attention weights, residual branches
  bool bias = true;         // in the Linear layers and LayerNorms
  bool geluTanh = false;    // the MLP's GELU by its tanh approximation (GPT-2's), not exactly
  bool recompute = false;   // each block's activations recomputed in backward (model.recompute)
};

// The name PyTorch's state dict gives the tied output head besides
// transformer.wte.weight.
inline constexpr const char* kTiedHeadName = "lm_head.weight";

// The options model.* give; `vocabSize` replaces model.vocab_size when that is 0.
GptOptions gptOptions(const ModelConfig& config, int64_t vocabSize);

// Causal multi-head self-attention, the GPT's and its tensor-parallel
// slices' (parallel/tensor_gpt.h): q, k, v [B, H, S, D] -> [B, S, H D],
// each position attending to itself and the earlier ones, scores scaled by
// 1/sqrt(D). The scale and the mask go into one product (baddbmm). `mask`
// caches the [S, S] mask (0 where a position may attend, -inf where not)
// between calls, of `maskOptions`' dtype and device (the residual
// stream's: float32 under autocast, which casts it with the product's other
// inputs); `dropAttention`, if set, applies to the attention weights.
// Without `dropAttention`, CPU tensors of float32 or float64 take
// the blockwise kernel of models/flash_attention.h instead, which never
// holds the [B, H, S, S] scores (nor builds `mask`); the values agree up to
// rounding. bfloat16 CPU tensors (bf16 autocast) with the fused ops on take
// blocks of 128 queries, each against the keys up to its end
// (models/attention.h), nor build `mask` either.
at::Tensor causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& mask,
                           const at::TensorOptions& maskOptions,
                           const std::function<at::Tensor(const at::Tensor&)>& dropAttention = {});

// The same over one projection's output qkv [B, S, 3 H D] (q, k and v side
// by side, as c_attn makes them), `heads` heads. Where the blockwise kernel
// applies, it takes qkv whole and its backward writes one gradient for it
// (no concatenation of three); otherwise qkv is split and causalAttention
// runs.
at::Tensor causalAttentionPacked(const at::Tensor& qkv, int64_t heads, at::Tensor& mask,
                                 const at::TensorOptions& maskOptions,
                                 const std::function<at::Tensor(const at::Tensor&)>& dropAttention = {});

// Throws ConfigError naming the model.* key when the options cannot work
// (n_embd not divisible by n_head, a size < 1). `part`: only those blocks
// (models/model.h); the whole model by default.
std::shared_ptr<Model> createGpt(const GptOptions& options, const ModelPart& part = {});

}  // namespace cohort::models
