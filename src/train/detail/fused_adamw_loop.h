#pragma once

// The loop of adamwUpdate (train/detail/fused_adamw.h), over ATen's
// Vectorized<float>, compiled by each file that includes it for that file's
// instructions: the build's baseline in train/fused_adamw.cc, AVX2 and FMA
// in train/fused_adamw_avx2.cc. Internal linkage, so that each keeps its own
// copy (one inline function of both would be either at the linker's choice).

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>

#include "train/detail/fused_adamw_arrays.h"

namespace cohort::train::detail {
namespace {

// One vector of elements [i, i + n), n <= Vec::size(): the arithmetic of
// LibTorch's AdamW, operation by operation (see fused_adamw.h).
template <typename Vec>
inline void adamwVector(const AdamWArrays& a, const AdamWScalars& s, int64_t i, int64_t n) {
  const Vec decay(s.decay), beta1(s.beta1), oneMinusBeta1(s.oneMinusBeta1), beta2(s.beta2),
      oneMinusBeta2(s.oneMinusBeta2), correction2(s.sqrtCorrection2), eps(s.eps), step(s.negStepSize);
  Vec p = Vec::loadu(a.param + i, n);
  const Vec g = Vec::loadu(a.grad + i, n);
  Vec m = Vec::loadu(a.expAvg + i, n);
  Vec v = Vec::loadu(a.expAvgSq + i, n);
  p = p * decay;
  m = at::vec::fmadd(g, oneMinusBeta1, m * beta1);
  v = v * beta2 + oneMinusBeta2 * g * g;
  Vec denomSq = v;
  if (a.maxExpAvgSq != nullptr) {
    denomSq = at::vec::maximum(Vec::loadu(a.maxExpAvgSq + i, n), v);
    denomSq.store(a.maxExpAvgSq + i, static_cast<int>(n));
  }
  const Vec denom = denomSq.sqrt() / correction2 + eps;
  p = p + step * m / denom;
  p.store(a.param + i, static_cast<int>(n));
  m.store(a.expAvg + i, static_cast<int>(n));
  v.store(a.expAvgSq + i, static_cast<int>(n));
}

// Whole vectors, then the last partial one through the same operations
// (partial loads and stores), so every element gets the same arithmetic
// wherever a piece of the range starts.
inline void adamwLoop(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end) {
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t kWidth = Vec::size();
  int64_t i = begin;
  for (; i + kWidth <= end; i += kWidth) adamwVector<Vec>(a, s, i, kWidth);
  if (i < end) adamwVector<Vec>(a, s, i, end - i);
}

}  // namespace
}  // namespace cohort::train::detail
