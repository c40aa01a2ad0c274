#pragma once

// Causal attention computed block by block, never holding the [T, T] score
// matrix whole (the blockwise online softmax of FlashAttention, on the CPU).
//
// Forward: for each (batch, head) and block of query rows, the blocks of
// keys at or below the diagonal only; each block's scores are one small
// product q k^T, folded into a running maximum, sum and output per row
// (online softmax). Saved for backward: q, k, v, the output and one
// logsumexp per row, O(T) beside the inputs where the product of the whole
// matrix keeps O(T^2). Backward recomputes each block's probabilities from
// q, k and the logsumexp.

#include <ATen/core/Tensor.h>

#include <array>
#include <tuple>
#include <utility>

namespace cohort::models {

// True when flashAttention takes q, k, v: 4-d CPU tensors of one dtype,
// float32, float64 or bfloat16 (computed in float32), of one shape
// [B, H, T, D].
bool flashAttentionTakes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// True when causalAttention (models/gpt.h) should use flashAttention:
// flashAttentionTakes, not bfloat16, and COHORT_ATTENTION not "matmul"
// (core/env.h). bfloat16 (q, k, v under bf16 autocast) keeps the product
// of the whole matrix: there LibTorch's bfloat16 products (AMX,
// avx512_bf16) beat converting to float32 for this kernel
// (docs/performance.md). CUDA tensors and other dtypes keep it too.
bool flashAttentionApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Causal attention, q, k, v [B, H, T, D] (any strides) -> [B, T, H D] of
// q's dtype: row t of each head is softmax(q_t k_s^T / sqrt(D), s <= t)
// times v. Differentiable once in q, k and v (its backward is not itself
// differentiable). Preconditions: flashAttentionTakes, else COHORT_ASSERT
// fails.
at::Tensor flashAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// q, k, v as [B, H, T, D] views of one projection's output qkv
// [B, T, 3 H D].
std::array<at::Tensor, 3> headsOf(const at::Tensor& qkv, int64_t heads);

// Whether flashAttentionPacked takes qkv: [B, T, 3 C] with C a multiple of
// heads, whose views flashAttentionApplies to.
bool flashAttentionPackedApplies(const at::Tensor& qkv, int64_t heads);

// flashAttention of headsOf(qkv), differentiable in qkv: its backward
// writes dq, dk and dv side by side into one [B, T, 3 C] gradient, where
// the split's backward would concatenate three (3.1 ms a step of the GPT
// example's 340 on one EPYC core). Preconditions: flashAttentionPackedApplies.
at::Tensor flashAttentionPacked(const at::Tensor& qkv, int64_t heads);

// Forces the product of the whole matrix (true) or lets the blockwise kernel
// run where it applies (false, the default unless COHORT_ATTENTION says
// matmul), process-wide: for benchmarks comparing the two in one process.
void setAttentionMatmulOnly(bool matmulOnly);

namespace detail {

// The kernels themselves, float32 or float64 (bfloat16 is converted by
// flashAttention). Forward: {output [B, T, H D], logsumexp [B, H, T]}.
std::pair<at::Tensor, at::Tensor> flashForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Backward from the forward's output and logsumexp and the gradient of the
// output, dOut [B, T, H D]: {dq, dk, dv}, each [B, H, T, D].
std::tuple<at::Tensor, at::Tensor, at::Tensor> flashBackward(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, const at::Tensor& out,
                                                             const at::Tensor& logsumexp, const at::Tensor& dOut);

// The same into dq, dk and dv given as [B, T, H, D] (any strides along
// B, T and H, unit along D; whatever they hold is overwritten), q's dtype.
void flashBackwardInto(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                       const at::Tensor& logsumexp, const at::Tensor& dOut, const at::Tensor& dq,
                       const at::Tensor& dk, const at::Tensor& dv);

}  // namespace detail
}  // namespace cohort::models
