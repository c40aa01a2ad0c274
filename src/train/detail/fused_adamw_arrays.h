#pragma once

// The arrays and scalars of one parameter's fused AdamW step and the
// functions that step them (train/detail/fused_adamw.h has the rest; the
// loop is train/detail/fused_adamw_loop.h). Without LibTorch's
// headers: train/fused_adamw_avx2.cc, compiled for AVX2, includes this and
// ATen's vector header only, so that no inline function of LibTorch's gets
// an AVX2 copy another file could link against.

#include <cstdint>

namespace cohort::train::detail {

// One parameter's arrays, element k of each beside element k of the others.
struct AdamWArrays {
  float* param = nullptr;
  const float* grad = nullptr;
  float* expAvg = nullptr;
  float* expAvgSq = nullptr;
  float* maxExpAvgSq = nullptr;  // amsgrad's running maximum; nullptr without amsgrad
  int64_t size = 0;
};

// The scalars of one parameter's step, rounded to float.
struct AdamWScalars {
  float decay = 1;  // 1 - lr * weight_decay
  float beta1 = 0, oneMinusBeta1 = 0, beta2 = 0, oneMinusBeta2 = 0;
  float sqrtCorrection2 = 1;  // sqrt(1 - beta2^step)
  float eps = 0;
  float negStepSize = 0;  // -(lr / (1 - beta1^step))
};

// Steps elements [begin, end) of `a`. No allocation, no threads. With AVX2
// and FMA instructions on a CPU that has them (adamwUpdateAvx2, x86-64).
void adamwUpdate(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end);
void adamwUpdateAvx2(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end);

}  // namespace cohort::train::detail
