#include "models/softmax_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define COHORT_ROW_VECTORS 1
#endif

#include "models/fused_kernels.h"

namespace cohort::models::detail {
namespace {

constexpr float kExpLow = -87.0f, kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

float expShifted(float x, float shift) {
  float y = std::max(x - shift, kExpLow);
  const float f = std::floor(y * kLog2e + 0.5f);
  y = y - f * kLn2Hi - f * kLn2Lo;
  float p = kExpPoly[0];
  for (int j = 1; j < 6; ++j) p = p * y + kExpPoly[j];
  p = p * y * y + y + 1.0f;
  const int32_t bits = (static_cast<int32_t>(f) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

float expScalar(float* x, int64_t n, float shift) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = expShifted(x[i], shift);
    sum += x[i];
  }
  return sum;
}

float maxScalar(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

#ifdef COHORT_ROW_VECTORS
// GCC 12 takes the self-initialized operand of its own _mm512_undefined_*
// (inside _mm512_max_ps, _mm512_cvtps_epi32, _mm512_reduce_*_ps) for an uninitialized one once
// inlined into a function compiled by a target attribute.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
__attribute__((target("avx2,fma"))) float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) float expAvx2(float* x, int64_t n, float shift) {
  const __m256 vshift = _mm256_set1_ps(shift), low = _mm256_set1_ps(kExpLow), log2e = _mm256_set1_ps(kLog2e);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 ln2Hi = _mm256_set1_ps(kLn2Hi), ln2Lo = _mm256_set1_ps(kLn2Lo);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 y = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vshift), low);
    const __m256 f = _mm256_floor_ps(_mm256_fmadd_ps(y, log2e, half));
    y = _mm256_fnmadd_ps(f, ln2Lo, _mm256_fnmadd_ps(f, ln2Hi, y));
    __m256 p = _mm256_set1_ps(kExpPoly[0]);
    for (int j = 1; j < 6; ++j) p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(kExpPoly[j]));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, y), y, y), one);
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(f), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  return hsum8(acc) + expScalar(x + i, n - i, shift);
}

__attribute__((target("avx2,fma"))) float maxAvx2(const float* x, int64_t n) {
  __m256 acc = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, _mm256_loadu_ps(x + i));
  return std::max(hmax8(acc), maxScalar(x + i, n - i));
}

__attribute__((target("avx512f"))) float expAvx512(float* x, int64_t n, float shift) {
  const __m512 vshift = _mm512_set1_ps(shift), low = _mm512_set1_ps(kExpLow), log2e = _mm512_set1_ps(kLog2e);
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
  const __m512 ln2Hi = _mm512_set1_ps(kLn2Hi), ln2Lo = _mm512_set1_ps(kLn2Lo);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 y = _mm512_max_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vshift), low);
    const __m512 f = _mm512_floor_ps(_mm512_fmadd_ps(y, log2e, half));
    y = _mm512_fnmadd_ps(f, ln2Lo, _mm512_fnmadd_ps(f, ln2Hi, y));
    __m512 p = _mm512_set1_ps(kExpPoly[0]);
    for (int j = 1; j < 6; ++j) p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(kExpPoly[j]));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, y), y, y), one);
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(f), _mm512_set1_epi32(127)), 23);
    const __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  return _mm512_reduce_add_ps(acc) + expAvx2(x + i, n - i, shift);
}

__attribute__((target("avx512f"))) float maxAvx512(const float* x, int64_t n) {
  __m512 acc = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(acc, _mm512_loadu_ps(x + i));
  return std::max(_mm512_reduce_max_ps(acc), maxAvx2(x + i, n - i));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace

RowBuild softmaxRowBuild() {
  static const RowBuild build = [] {
    const std::string isa = fusedKernelsIsa();
    return isa == "avx512" ? RowBuild::avx512 : isa == "avx2" ? RowBuild::avx2 : RowBuild::scalar;
  }();
  return build;
}

float rowMax(RowBuild build, const float* x, int64_t n) {
#ifdef COHORT_ROW_VECTORS
  if (build == RowBuild::avx512) return maxAvx512(x, n);
  if (build == RowBuild::avx2) return maxAvx2(x, n);
#endif
  return maxScalar(x, n);
}

float rowMax(const float* x, int64_t n) { return rowMax(softmaxRowBuild(), x, n); }

float expShiftedInPlace(RowBuild build, float* x, int64_t n, float shift) {
#ifdef COHORT_ROW_VECTORS
  if (build == RowBuild::avx512) return expAvx512(x, n, shift);
  if (build == RowBuild::avx2) return expAvx2(x, n, shift);
#endif
  return expScalar(x, n, shift);
}

float expShiftedInPlace(float* x, int64_t n, float shift) { return expShiftedInPlace(softmaxRowBuild(), x, n, shift); }

}  // namespace cohort::models::detail
