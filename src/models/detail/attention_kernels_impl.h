#pragma once

// The blockwise attention's float32 block steps (models/fused_kernels.h,
// AttentionKernelTable): its products, transposes and the softmax's steps
// over a block of scores, written once over ATen's Vectorized<float> and
// compiled for AVX2 and for AVX-512 by models/fused_kernels_{avx2,avx512}.cc,
// with COHORT_KERNEL_ISA naming the build. The baseline has no table: there
// the attention calls BLAS and the row kernels of models/softmax_rows.h.
//
// Why not BLAS: the attention's products are 64 x 64 x D blocks (D the
// head's width, 32-128), too small for a library's packing of its operands
// to pay. OpenBLAS spent a third of such a product copying (perf on
// cohort_bench_attention); here A's elements are broadcast from where they
// are (any strides, so A transposed costs nothing) and B's rows are read in
// place, with one tile of C in registers for the whole sum over k.

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "models/fused_kernels.h"
#include "models/softmax_rows.h"

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

#ifndef COHORT_KERNEL_ISA
#error "models/detail/attention_kernels_impl.h: COHORT_KERNEL_ISA names the build (avx2, avx512)"
#endif

namespace cohort::models::detail::tiles {
namespace {

using V = at::vec::Vectorized<float>;
constexpr int64_t kWidth = V::size();

// Vectors of C held per tile, of the 32 vector registers of AVX-512 and the
// 16 of AVX2; the others hold B's row and A's broadcast element. Measured on
// one EPYC core, 64 x 64 x 32: 16 beat 24 on AVX-512 (273 GFLOP/s against
// 255), 12 beat 8 on AVX2 (130 against 126).
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kTileVectors = 16;
constexpr int kPanelVectors = 4;
#else
constexpr int kTileVectors = 12;
constexpr int kPanelVectors = 2;
#endif

// C[MR x NV vectors] = alpha * sum_p A(i, p) B(p, :) + beta * C; beta 0
// never reads C (it may hold anything).
template <int MR, int NV>
inline void tile(int64_t k, const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb, float* c,
                 int64_t ldc, float alpha, float beta) {
  V acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = V(0.f);
  }
  for (int64_t p = 0; p < k; ++p) {
    V bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) bv[j] = V::loadu(b + p * ldb + j * kWidth);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const V av(a[i * ars + p * acs]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] = at::vec::fmadd(av, bv[j], acc[i][j]);
    }
  }
  const V va(alpha), vb(beta);
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      float* cp = c + i * ldc + j * kWidth;
      const V r = acc[i][j] * va;
      (beta == 0.f ? r : at::vec::fmadd(vb, V::loadu(cp), r)).store(cp);
    }
  }
}

// The same for the last `cols` (< kWidth) columns of C: one partial vector.
template <int MR>
inline void tileEdge(int64_t k, int64_t cols, const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb,
                     float* c, int64_t ldc, float alpha, float beta) {
  V acc[MR];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) acc[i] = V(0.f);
  for (int64_t p = 0; p < k; ++p) {
    const V bv = V::loadu(b + p * ldb, static_cast<int>(cols));
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) acc[i] = at::vec::fmadd(V(a[i * ars + p * acs]), bv, acc[i]);
  }
  const V va(alpha), vb(beta);
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
    float* cp = c + i * ldc;
    const V r = acc[i] * va;
    (beta == 0.f ? r : at::vec::fmadd(vb, V::loadu(cp, static_cast<int>(cols)), r)).store(cp, static_cast<int>(cols));
  }
}

// Rows [0, m) of one panel of NV vectors: tiles of MR rows, then one tile
// of the rows left (R < MR, chosen at run time among the instantiations).
template <int NV, int R>
inline void lastRows(int64_t rows, int64_t k, const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb,
                     float* c, int64_t ldc, float alpha, float beta) {
  if constexpr (R > 0) {
    if (rows == R) return tile<R, NV>(k, a, ars, acs, b, ldb, c, ldc, alpha, beta);
    lastRows<NV, R - 1>(rows, k, a, ars, acs, b, ldb, c, ldc, alpha, beta);
  }
}

template <int NV>
void panel(int64_t m, int64_t k, const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb, float* c,
           int64_t ldc, float alpha, float beta) {
  constexpr int MR = kTileVectors / NV;
  int64_t i = 0;
  for (; i + MR <= m; i += MR) tile<MR, NV>(k, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, alpha, beta);
  lastRows<NV, MR - 1>(m - i, k, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, alpha, beta);
}

void edgePanel(int64_t m, int64_t cols, int64_t k, const float* a, int64_t ars, int64_t acs, const float* b,
               int64_t ldb, float* c, int64_t ldc, float alpha, float beta) {
  constexpr int MR = kTileVectors / 2;
  int64_t i = 0;
  for (; i + MR <= m; i += MR) tileEdge<MR>(k, cols, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, alpha, beta);
  for (; i < m; ++i) tileEdge<1>(k, cols, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, alpha, beta);
}

void product(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t ars, int64_t acs, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc) {
  int64_t j = 0;
  for (; j + kPanelVectors * kWidth <= n; j += kPanelVectors * kWidth) {
    panel<kPanelVectors>(m, k, a, ars, acs, b + j, ldb, c + j, ldc, alpha, beta);
  }
  if constexpr (kPanelVectors > 2) {
    if (j + 2 * kWidth <= n) {
      panel<2>(m, k, a, ars, acs, b + j, ldb, c + j, ldc, alpha, beta);
      j += 2 * kWidth;
    }
  }
  if (j + kWidth <= n) {
    panel<1>(m, k, a, ars, acs, b + j, ldb, c + j, ldc, alpha, beta);
    j += kWidth;
  }
  if (j < n) edgePanel(m, n - j, k, a, ars, acs, b + j, ldb, c + j, ldc, alpha, beta);
}

// y[c * ldy + r] = x[r * ldx + c]: 8 x 8 blocks through registers (AVX2's
// unpack, shuffle and lane permute, which the AVX-512 build has too), the
// edges element by element.
void transpose(const float* x, int64_t ldx, int64_t rows, int64_t cols, float* y, int64_t ldy) {
  int64_t r = 0;
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  for (; r + 8 <= rows; r += 8) {
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const float* s = x + r * ldx + c;
      const __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ldx), r2 = _mm256_loadu_ps(s + 2 * ldx),
                   r3 = _mm256_loadu_ps(s + 3 * ldx), r4 = _mm256_loadu_ps(s + 4 * ldx),
                   r5 = _mm256_loadu_ps(s + 5 * ldx), r6 = _mm256_loadu_ps(s + 6 * ldx),
                   r7 = _mm256_loadu_ps(s + 7 * ldx);
      const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                   t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                   t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
      const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                   s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                   s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                   s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* d = y + c * ldy + r;
      _mm256_storeu_ps(d, _mm256_permute2f128_ps(s0, s4, 0x20));
      _mm256_storeu_ps(d + ldy, _mm256_permute2f128_ps(s1, s5, 0x20));
      _mm256_storeu_ps(d + 2 * ldy, _mm256_permute2f128_ps(s2, s6, 0x20));
      _mm256_storeu_ps(d + 3 * ldy, _mm256_permute2f128_ps(s3, s7, 0x20));
      _mm256_storeu_ps(d + 4 * ldy, _mm256_permute2f128_ps(s0, s4, 0x31));
      _mm256_storeu_ps(d + 5 * ldy, _mm256_permute2f128_ps(s1, s5, 0x31));
      _mm256_storeu_ps(d + 6 * ldy, _mm256_permute2f128_ps(s2, s6, 0x31));
      _mm256_storeu_ps(d + 7 * ldy, _mm256_permute2f128_ps(s3, s7, 0x31));
    }
    for (; c < cols; ++c) {
      for (int64_t i = r; i < r + 8; ++i) y[c * ldy + i] = x[i * ldx + c];
    }
  }
#endif
  for (; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[c * ldy + r] = x[r * ldx + c];
  }
}

// The softmax's steps over a block of scores, one call per block where the
// kernel made a few per row (a profile of the GPT's attention put a sixth
// of its time in the row calls of models/softmax_rows.h and in loops of the
// baseline build). Row r of a block keeps its first causalKept(r, diag,
// cols) values (models/fused_kernels.h); the others become 0.

// A row's exp and maximum: models/softmax_rows.h's kernels of this build
// (Cephes' expf, within 2 ulp, inline vector code where ATen's SLEEF call
// took twice as long in the kernel's profile).
#if defined(CPU_CAPABILITY_AVX512)
constexpr RowBuild kRowBuild = RowBuild::avx512;
#else
constexpr RowBuild kRowBuild = RowBuild::avx2;
#endif

// x[0, n) = exp(x - shift), and their sum.
float expRow(float* x, int64_t n, float shift) { return expShiftedInPlace(kRowBuild, x, n, shift); }

float maxRow(const float* x, int64_t n) { return rowMax(kRowBuild, x, n); }

// The forward's online softmax over one block of scores s (rows lds apart):
// per row, the running maximum m and sum l take in the block's kept values,
// which become exp(s - m); the row's output accumulator (acc, nd values per
// row) is scaled by exp(old m - new m).
void softmaxBlock(float* s, int64_t lds, int64_t rows, int64_t cols, int64_t diag, float* m, float* l, float* acc,
                  int64_t nd) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * lds;
    const int64_t kept = causalKept(r, diag, cols);
    const float mx = std::max(m[r], maxRow(row, kept));
    const float sum = kept > 0 ? expRow(row, kept, mx) : 0.f;
    std::fill(row + kept, row + cols, 0.f);
    // The first block's correction multiplies zeros: exp(-inf) = 0.
    const float correction = m[r] == mx ? 1.f : std::exp(m[r] - mx);
    if (correction != 1.f) {
      float* a = acc + r * nd;
      const V vc(correction);
      int64_t j = 0;
      for (; j + kWidth <= nd; j += kWidth) (V::loadu(a + j) * vc).store(a + j);
      for (; j < nd; ++j) a[j] *= correction;
    }
    l[r] = l[r] * correction + sum;
    m[r] = mx;
  }
}

// The backward's probabilities from the scores: p = exp(p - shift[r]) where
// kept, 0 beyond.
void expBlock(float* p, int64_t ldp, int64_t rows, int64_t cols, int64_t diag, const float* shift) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * ldp;
    const int64_t kept = causalKept(r, diag, cols);
    if (kept > 0) expRow(row, kept, shift[r]);
    std::fill(row + kept, row + cols, 0.f);
  }
}

// The scores' gradient from the probabilities' (in ds): ds = p * (ds - d[r]).
void scoreGradBlock(float* ds, const float* p, int64_t ld, int64_t rows, int64_t cols, const float* d) {
  for (int64_t r = 0; r < rows; ++r) {
    float* g = ds + r * ld;
    const float* pr = p + r * ld;
    const V vd(d[r]);
    int64_t j = 0;
    for (; j + kWidth <= cols; j += kWidth) (V::loadu(pr + j) * (V::loadu(g + j) - vd)).store(g + j);
    for (; j < cols; ++j) g[j] = pr[j] * (g[j] - d[r]);
  }
}

}  // namespace
}  // namespace cohort::models::detail::tiles

namespace cohort::models::detail::isa {

const AttentionKernelTable& COHORT_KERNEL_ISA(AttentionKernelTable::Tag) {
  static const AttentionKernelTable t{&tiles::product, &tiles::transpose, &tiles::softmaxBlock, &tiles::expBlock,
                                     &tiles::scoreGradBlock};
  return t;
}

}  // namespace cohort::models::detail::isa
