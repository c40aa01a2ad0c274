#pragma once

// The fused ops' loops on bfloat16 storage (models/fused_kernels.h): the
// causal softmax, and GELU with its slope. Compiled once per instruction
// set beside the float loops: models/fused_kernels_{base,avx2,avx512}.cc
// include this file after models/detail/fused_kernels_impl.h, whose
// helpers (Vec, hsum, rowGrain, kGrain, geluAndSlope) it uses.
// Values are computed in float32: a bfloat16 row is widened into a float
// buffer of the thread's, and rounded to nearest even (ATen's conversion)
// when stored. The row maximum and exp are models/softmax_rows.h's, whose
// builds follow the same choice of instruction set.

#include <c10/util/BFloat16.h>

#include <cstring>
#include <vector>

#include "models/softmax_rows.h"

#ifndef COHORT_KERNEL_ISA
#error "models/detail/bf16_kernels_impl.h: include models/detail/fused_kernels_impl.h first"
#endif

// GCC 12 takes the self-initialized operand of its own _mm512_undefined_*
// (inside ATen's AVX-512 bfloat16 conversions) for an uninitialized one once
// inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace cohort::models::detail::kernels {
namespace {

using Bf16 = c10::BFloat16;

// Whole vectors only: a partial vector's load or store goes through a copy
// (ATen's loadu(p, count)), which per row of a few dozen values cost more
// than the row. Rows are therefore read and written up to the end of their
// last vector (their `span`, at most the row), and what lies past the kept
// values is zeroed; a remainder shorter than a vector (t not a multiple of
// it) goes one value at a time.

// Calls vec(j) for each whole vector of V values in [0, n), then one(i)
// for each value after them.
template <int64_t V, typename FV, typename F1>
inline void forVectors(int64_t n, FV vec, F1 one) {
  int64_t j = 0;
  for (; j + V <= n; j += V) vec(j);
  for (; j < n; ++j) one(j);
}

// Values read or written for a row that keeps `kept` of its t: through the
// end of the vector of V holding the last kept one.
template <int64_t V>
inline int64_t spanOf(int64_t kept, int64_t t) {
  return std::min(t, (kept + V - 1) / V * V);
}

template <typename S>
inline void zero(S* p, int64_t n) {
  if (n > 0) std::memset(static_cast<void*>(p), 0, static_cast<size_t>(n) * sizeof(S));  // 0 is all bits 0
}

constexpr int64_t kF = Vec<float>::size();
constexpr int64_t kB = Vec<Bf16>::size();

// bfloat16 src[0..n) widened into the float buffer buf.
inline void widen(const Bf16* src, float* buf, int64_t n) {
  forVectors<kB>(
      n,
      [&](int64_t j) {
        const auto [lo, hi] = at::vec::convert_bfloat16_float(Vec<Bf16>::loadu(src + j));
        lo.store(buf + j);
        hi.store(buf + j + kF);
      },
      [&](int64_t i) { buf[i] = static_cast<float>(src[i]); });
}

// dst[0..n) = buf[0..n) * scale, rounded to bfloat16 (nearest even).
inline void narrowScaled(const float* buf, float scale, Bf16* dst, int64_t n) {
  const Vec<float> s(scale);
  forVectors<kB>(
      n,
      [&](int64_t j) {
        at::vec::convert_float_bfloat16(Vec<float>::loadu(buf + j) * s, Vec<float>::loadu(buf + j + kF) * s)
            .store(dst + j);
      },
      [&](int64_t i) { dst[i] = static_cast<Bf16>(buf[i] * scale); });
}

// Row r of [.., q, t] causal scores (the queries the last q of t
// positions) keeps its first t - q + r % q + 1 values.
inline int64_t keptOf(int64_t r, int64_t q, int64_t t) { return t - q + r % q + 1; }

// The largest value and exp of the row shifted by it, with their sum, are
// models/softmax_rows.h's row operations (its own vector builds, the ones
// the blockwise attention runs).
inline float expRow(float* x, int64_t n) { return expShiftedInPlace(x, n, rowMax(x, n)); }

void causalSoftmaxForward(const Bf16* x, Bf16* y, int64_t rows, int64_t q, int64_t t) {
  at::parallel_for(0, rows, rowGrain(t), [=](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(t));
    float* b = row.data();
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t kept = keptOf(r, q, t), span = spanOf<kB>(kept, t);
      Bf16* yr = y + r * t;
      widen(x + r * t, b, span);
      const float inv = 1.0f / expRow(b, kept);
      zero(b + kept, span - kept);
      narrowScaled(b, inv, yr, span);
      zero(yr + span, t - span);
    }
  });
}

// gx = y * (gy - dot(y, gy)) over n values, in float; gx may be gy.
inline void softmaxGrad(const float* y, const float* gy, float* gx, int64_t n) {
  Vec<float> dotv(0);
  float dot = 0;
  forVectors<kF>(
      n, [&](int64_t j) { dotv += Vec<float>::loadu(y + j) * Vec<float>::loadu(gy + j); },
      [&](int64_t i) { dot += y[i] * gy[i]; });
  const float d = static_cast<float>(hsum(dotv) + dot);
  const Vec<float> dv(d);
  forVectors<kF>(
      n, [&](int64_t j) { (Vec<float>::loadu(y + j) * (Vec<float>::loadu(gy + j) - dv)).store(gx + j); },
      [&](int64_t i) { gx[i] = y[i] * (gy[i] - d); });
}

void causalSoftmaxBackward(const Bf16* y, const Bf16* gy, Bf16* gx, int64_t rows, int64_t q, int64_t t) {
  at::parallel_for(0, rows, rowGrain(t), [=](int64_t r0, int64_t r1) {
    std::vector<float> rowY(static_cast<size_t>(t)), rowG(static_cast<size_t>(t));
    float* yb = rowY.data();
    float* gb = rowG.data();
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t kept = keptOf(r, q, t), span = spanOf<kB>(kept, t);
      Bf16* gxr = gx + r * t;
      widen(y + r * t, yb, span);
      widen(gy + r * t, gb, span);
      softmaxGrad(yb, gb, gb, kept);
      zero(gb + kept, span - kept);
      narrowScaled(gb, 1.0f, gxr, span);
      zero(gxr + span, t - span);
    }
  });
}

// --- GELU and its slope ------------------------------------------------------

// y = gelu(h), slope = gelu'(h) over n values (slope may be null), in
// float32 from the widened h, each rounded to bfloat16 once.
void geluForward(const Bf16* h, Bf16* y, Bf16* slope, int64_t n, bool tanh) {
  at::parallel_for(0, n, kGrain, [=](int64_t i0, int64_t i1) {
    auto pass = [&](int64_t j, int64_t k) {
      const auto [lo, hi] = at::vec::convert_bfloat16_float(
          k == kB ? Vec<Bf16>::loadu(h + j) : Vec<Bf16>::loadu(h + j, static_cast<int16_t>(k)));
      Vec<float> ylo, yhi, slo, shi;
      geluAndSlope(lo, tanh, ylo, slo);
      geluAndSlope(hi, tanh, yhi, shi);
      at::vec::convert_float_bfloat16(ylo, yhi).store(y + j, static_cast<int>(k));
      if (slope != nullptr) at::vec::convert_float_bfloat16(slo, shi).store(slope + j, static_cast<int>(k));
    };
    int64_t j = i0;
    for (; j + kB <= i1; j += kB) pass(j, kB);
    if (j < i1) pass(j, i1 - j);
  });
}

// gh = gy * slope over n values, in float32, rounded once.
void geluBackward(const Bf16* gy, const Bf16* slope, Bf16* gh, int64_t n) {
  at::parallel_for(0, n, kGrain, [=](int64_t i0, int64_t i1) {
    auto pass = [&](int64_t j, int64_t k) {
      const auto c = static_cast<int16_t>(k);
      const auto [g0, g1] =
          at::vec::convert_bfloat16_float(k == kB ? Vec<Bf16>::loadu(gy + j) : Vec<Bf16>::loadu(gy + j, c));
      const auto [s0, s1] =
          at::vec::convert_bfloat16_float(k == kB ? Vec<Bf16>::loadu(slope + j) : Vec<Bf16>::loadu(slope + j, c));
      at::vec::convert_float_bfloat16(g0 * s0, g1 * s1).store(gh + j, static_cast<int>(k));
    };
    int64_t j = i0;
    for (; j + kB <= i1; j += kB) pass(j, kB);
    if (j < i1) pass(j, i1 - j);
  });
}

// --- A linear layer's bias ---------------------------------------------------

// y += b per row of n: the sum in float32, rounded to nearest even once.
void addToRows(Bf16* y, const float* bw, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, rowGrain(n), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      Bf16* yr = y + r * n;
      forVectors<kB>(
          n,
          [&](int64_t j) {
            const auto [lo, hi] = at::vec::convert_bfloat16_float(Vec<Bf16>::loadu(yr + j));
            at::vec::convert_float_bfloat16(lo + Vec<float>::loadu(bw + j), hi + Vec<float>::loadu(bw + j + kF))
                .store(yr + j);
          },
          [&](int64_t i) { yr[i] = static_cast<Bf16>(static_cast<float>(yr[i]) + bw[i]); });
    }
  });
}

// out = g summed over the rows, in float32 per block of rows, the blocks in
// double (overRowBlocks).
void columnSums(const Bf16* g, float* out, int64_t rows, int64_t n) {
  overRowBlocks<float>(rows, n, out, [=](int64_t r, float* acc) {
    const Bf16* gr = g + r * n;
    forVectors<kB>(
        n,
        [&](int64_t j) {
          const auto [lo, hi] = at::vec::convert_bfloat16_float(Vec<Bf16>::loadu(gr + j));
          (Vec<float>::loadu(acc + j) + lo).store(acc + j);
          (Vec<float>::loadu(acc + j + kF) + hi).store(acc + j + kF);
        },
        [&](int64_t i) { acc[i] += static_cast<float>(gr[i]); });
  });
}

}  // namespace
}  // namespace cohort::models::detail::kernels

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace cohort::models::detail::isa {

const Bf16KernelTable& COHORT_KERNEL_ISA(Bf16KernelTable::Tag) {
  static const Bf16KernelTable t{&kernels::causalSoftmaxForward, &kernels::causalSoftmaxBackward,
                                 &kernels::geluForward, &kernels::geluBackward,
                                 &kernels::addToRows,   &kernels::columnSums};
  return t;
}

}  // namespace cohort::models::detail::isa
