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
#include "train/detail/vector_slot.h"

namespace cohort::train::detail {
namespace {

// The scalars broadcast to vectors, once per range.
template <typename Vec>
struct AdamWVectors {
  explicit AdamWVectors(const AdamWScalars& s)
      : decay(s.decay), beta1(s.beta1), oneMinusBeta1(s.oneMinusBeta1), beta2(s.beta2),
        oneMinusBeta2(s.oneMinusBeta2), correction2(s.sqrtCorrection2), eps(s.eps), step(s.negStepSize) {}
  Vec decay, beta1, oneMinusBeta1, beta2, oneMinusBeta2, correction2, eps, step;
};

// One vector of elements [i, i + n) (VectorSlot): the arithmetic of
// LibTorch's AdamW, operation by operation (see fused_adamw.h). Always
// inlined, so that whole vectors' loads and stores become vector moves.
template <typename Vec, bool kPartial>
__attribute__((always_inline)) inline void adamwVector(const AdamWArrays& a, const AdamWVectors<Vec>& c,
                                                       int64_t i, int64_t n) {
  const VectorSlot<Vec, kPartial> slot{i, n};
  Vec p = slot.load(a.param);
  const Vec g = slot.load(a.grad);
  Vec m = slot.load(a.expAvg);
  Vec v = slot.load(a.expAvgSq);
  p = p * c.decay;
  m = at::vec::fmadd(g, c.oneMinusBeta1, m * c.beta1);
  v = v * c.beta2 + c.oneMinusBeta2 * g * g;
  Vec denomSq = v;
  if (a.maxExpAvgSq != nullptr) {
    denomSq = at::vec::maximum(slot.load(a.maxExpAvgSq), v);
    slot.store(denomSq, a.maxExpAvgSq);
  }
  const Vec denom = denomSq.sqrt() / c.correction2 + c.eps;
  p = p + c.step * m / denom;
  slot.store(p, a.param);
  slot.store(m, a.expAvg);
  slot.store(v, a.expAvgSq);
}

// Whole vectors, then the last partial one through the same operations, so
// every element gets the same arithmetic wherever a piece of the range
// starts.
inline void adamwLoop(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end) {
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t kWidth = Vec::size();
  const AdamWVectors<Vec> c(s);
  int64_t i = begin;
  for (; i + kWidth <= end; i += kWidth) adamwVector<Vec, false>(a, c, i, kWidth);
  if (i < end) adamwVector<Vec, true>(a, c, i, end - i);
}

}  // namespace
}  // namespace cohort::train::detail
