#pragma once

// What the decoders (gpt, llama) share to generate with a KvCache
// (Model::decode): the batch of rows of several lengths, and attention over
// each row's cached keys and values, with grouped-query attention's fewer
// key/value heads.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "cohort/models/model.h"

namespace cohort::models {

// Model::decode's rows as one batch: tokens [rows, longest] padded with
// token 0, each row's positions from its cache's length on (clamped below
// `capacity`: padding positions stay inside a position table), on `device`.
// Each cache has its blocks for the new positions (KvCache; a cache without
// a pool gets a private one), and `groups` says where in the pools' slots
// the new keys go and the rows' keys are read from: the same for every layer.
struct DecodeRows {
  at::Tensor tokens, positions;
  std::vector<int64_t> lengths;  // positions each row's cache held before
  std::vector<int64_t> counts;   // each row's new tokens
  int64_t longest = 0;           // the longest row's positions, cached and new
  // The rows whose caches share one pool (usually all of them).
  struct Group {
    KvPool* pool = nullptr;
    at::Tensor rows;    // [n] the group's rows
    at::Tensor source;  // [new tokens] each new token's index in the batch's [rows * time] positions
    at::Tensor dest;    // [new tokens] the slot it is written to
    at::Tensor read;    // [n * longest] the slot of each row's positions 0 .. longest - 1 (padding: slot 0)
  };
  std::vector<Group> groups;
};

// Checks the rows and caches as Model::decode documents (DataError naming
// `model`), and lays them out.
DecodeRows decodeRows(const std::vector<at::Tensor>& rows, const std::vector<KvCache*>& caches, int64_t capacity,
                      const char* model, const at::Device& device);

// After a part's blocks: each cache advanced by its row's count.
void advanceCaches(const DecodeRows& rows, const std::vector<KvCache*>& caches);

// The residual stream a pipeline stage takes from the stage before for
// `rows`: [rows, longest row, width]. Throws DataError naming `model`.
void checkStageInput(const at::Tensor& hidden, const DecodeRows& rows, int64_t width, const char* model);

// After the blocks: each cache advanced by its row's count, and x [rows,
// longest, C] at each row's last new token: [rows, C].
at::Tensor lastOfEachRow(const at::Tensor& x, const DecodeRows& rows, const std::vector<KvCache*>& caches);

// Causal attention of q [B, H, T, D] over each row's cached keys and values
// and the new k, v [B, KV, T, D] (KV divides H: query head h reads key/value
// head h / (H / KV)), which are first written into caches[r]'s blocks at
// layer `layer` (a pool keeps [KV, D] per position: the grouped heads
// only). Row r's first counts[r] positions are its new tokens at positions
// lengths[r] ..; the rest is padding, never seen. Returns [B, T, H D].
at::Tensor cachedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<KvCache*>& caches, size_t layer, const DecodeRows& rows,
                           int64_t capacity);

namespace detail {

// Queries per block of causalBlocksAttention. cohort_bench_gpt's bf16 job
// on 1 rank x 1 thread (T = 256) measured 40.2K and 41.2K tokens/s at 128, 37.5K and 38.6K at 64,
// 36.6K and 35.8K at 32: smaller blocks skip more keys but their products
// run slower.
constexpr int64_t kCausalQueryBlock = 128;

// Whether causalAttention (cohort/models/gpt.h) takes causalBlocksAttention:
// fused ops on (models/fused_ops.h), q a bfloat16 CPU tensor [B, H, T, D]
// of more than one block of queries.
bool causalBlocksApply(const at::Tensor& q);

// Causal attention in blocks of kCausalQueryBlock queries, q, k, v
// [B, H, T, D] -> [B, T, H D]: block [s, e) takes scores against keys
// [0, e) only (q scaled by 1/sqrt(D) first), causalSoftmax over them
// (models/fused_ops.h: each query over the keys up to its own position),
// dropAttention if set, then the product with values [0, e). The products
// skip the keys past each block: a quarter of the whole matrix's at two
// blocks, 3/8 at four; the values agree with the whole matrix's to
// bfloat16 rounding.
at::Tensor causalBlocksAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::function<at::Tensor(const at::Tensor&)>& dropAttention);

}  // namespace detail

}  // namespace cohort::models
