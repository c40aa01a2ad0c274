#pragma once

// The loop of sgdUpdate (train/detail/fused_sgd_arrays.h), over ATen's
// Vectorized<float>, compiled by each file that includes it for that file's
// instructions: the build's baseline in train/fused_sgd.cc, AVX2 and FMA in
// train/fused_sgd_avx2.cc. Internal linkage, so that each keeps its own
// copy.
//
// The arithmetic is LibTorch 1.13's SGD, operation by operation, each
// `add` with an alpha being ATen's multiply-add:
//
//   d = fmadd(p, wd, g)                 (grad.add(param, wd); d = g without decay)
//   b = d                               (the first step), else
//   b = fmadd(d, 1 - dampening, b * m)  (buf.mul_(m).add_(d, 1 - dampening))
//   s = fmadd(b, m, d) (Nesterov), else s = b
//   p = fmadd(s, -lr, p)                (param.add_(s, -lr))
//
// With ATen's AVX2 vectors the roundings are those of ATen's own AVX2
// kernels; with the generic ones a multiply-add may round twice.

#include <ATen/cpu/vec/vec.h>

#include <cstdint>

#include "train/detail/fused_sgd_arrays.h"
#include "train/detail/vector_slot.h"

namespace cohort::train::detail {
namespace {

template <typename Vec>
struct SgdVectors {
  explicit SgdVectors(const SgdScalars& s)
      : negLr(-s.lr), weightDecay(s.weightDecay), momentum(s.momentum), keep(s.keep) {}
  Vec negLr, weightDecay, momentum, keep;
};

// One vector of elements [i, i + n) (VectorSlot). Always inlined, so that
// whole vectors' loads and stores become vector moves.
template <typename Vec, bool kPartial>
__attribute__((always_inline)) inline void sgdVector(const SgdArrays& a, const SgdScalars& s,
                                                     const SgdVectors<Vec>& c, int64_t i, int64_t n) {
  const VectorSlot<Vec, kPartial> slot{i, n};
  const Vec p = slot.load(a.param);
  const Vec g = slot.load(a.grad);
  const Vec d = s.weightDecay != 0 ? at::vec::fmadd(p, c.weightDecay, g) : g;
  Vec step = d;
  if (a.momentumBuffer != nullptr) {
    const Vec b = s.firstStep ? d : at::vec::fmadd(d, c.keep, slot.load(a.momentumBuffer) * c.momentum);
    slot.store(b, a.momentumBuffer);
    step = s.nesterov ? at::vec::fmadd(b, c.momentum, d) : b;
  }
  slot.store(at::vec::fmadd(step, c.negLr, p), a.param);
}

// Whole vectors, then the last partial one through the same operations, so
// every element gets the same arithmetic wherever a piece of the range
// starts (the same bits for any number of threads).
inline void sgdLoop(const SgdArrays& a, const SgdScalars& s, int64_t begin, int64_t end) {
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t kWidth = Vec::size();
  const SgdVectors<Vec> c(s);
  int64_t i = begin;
  for (; i + kWidth <= end; i += kWidth) sgdVector<Vec, false>(a, s, c, i, kWidth);
  if (i < end) sgdVector<Vec, true>(a, s, c, i, end - i);
}

}  // namespace
}  // namespace cohort::train::detail
