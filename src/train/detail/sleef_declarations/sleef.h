#pragma once

// Declarations of the SLEEF functions ATen's AVX2 vector headers name, for
// train/fused_adamw_avx2.cc only (its include path has this directory;
// Debian's LibTorch ships ATen's vector headers without SLEEF's). ATen's
// AVX2 Vectorized<float> calls SLEEF only for transcendental functions
// (exp, log, sin, ...), which the AdamW loop never uses: nothing here is
// ever called or defined, and a use would fail to link, not run wrong.

#include <immintrin.h>

extern "C" {

struct Sleef___m256_2 {
  __m256 x, y;
};
struct Sleef___m256d_2 {
  __m256d x, y;
};

const __m256 Sleef_acosf8_u10(__m256);
const __m256d Sleef_acosd4_u10(__m256d);
const __m256 Sleef_asinf8_u10(__m256);
const __m256d Sleef_asind4_u10(__m256d);
const __m256 Sleef_atanf8_u10(__m256);
const __m256d Sleef_atand4_u10(__m256d);
const __m256 Sleef_cosf8_u10(__m256);
const __m256d Sleef_cosd4_u10(__m256d);
const __m256 Sleef_coshf8_u10(__m256);
const __m256d Sleef_coshd4_u10(__m256d);
const __m256 Sleef_erff8_u10(__m256);
const __m256d Sleef_erfd4_u10(__m256d);
const __m256 Sleef_erfcf8_u15(__m256);
const __m256d Sleef_erfcd4_u15(__m256d);
const __m256 Sleef_expf8_u10(__m256);
const __m256d Sleef_expd4_u10(__m256d);
const __m256 Sleef_expm1f8_u10(__m256);
const __m256d Sleef_expm1d4_u10(__m256d);
const __m256 Sleef_lgammaf8_u10(__m256);
const __m256d Sleef_lgammad4_u10(__m256d);
const __m256 Sleef_log10f8_u10(__m256);
const __m256d Sleef_log10d4_u10(__m256d);
const __m256 Sleef_log1pf8_u10(__m256);
const __m256d Sleef_log1pd4_u10(__m256d);
const __m256 Sleef_log2f8_u10(__m256);
const __m256d Sleef_log2d4_u10(__m256d);
const __m256 Sleef_logf8_u10(__m256);
const __m256d Sleef_logd4_u10(__m256d);
const __m256 Sleef_sinf8_u10(__m256);
const __m256d Sleef_sind4_u10(__m256d);
const __m256 Sleef_sinhf8_u10(__m256);
const __m256d Sleef_sinhd4_u10(__m256d);
const __m256 Sleef_tanf8_u10(__m256);
const __m256d Sleef_tand4_u10(__m256d);
const __m256 Sleef_tanhf8_u10(__m256);
const __m256d Sleef_tanhd4_u10(__m256d);
const __m256 Sleef_atan2f8_u10(__m256, __m256);
const __m256d Sleef_atan2d4_u10(__m256d, __m256d);
const __m256 Sleef_copysignf8(__m256, __m256);
const __m256d Sleef_copysignd4(__m256d, __m256d);
const __m256 Sleef_fmodf8(__m256, __m256);
const __m256d Sleef_fmodd4(__m256d, __m256d);
const __m256 Sleef_hypotf8_u05(__m256, __m256);
const __m256d Sleef_hypotd4_u05(__m256d, __m256d);
const __m256 Sleef_nextafterf8(__m256, __m256);
const __m256d Sleef_nextafterd4(__m256d, __m256d);
const __m256 Sleef_powf8_u10(__m256, __m256);
const __m256d Sleef_powd4_u10(__m256d, __m256d);
Sleef___m256_2 Sleef_sincosf8_u10(__m256);
Sleef___m256d_2 Sleef_sincosd4_u10(__m256d);

}  // extern "C"
