#pragma once

// The arrays and scalars of one parameter's fused SGD step and the
// functions that step them (the loop is train/detail/fused_sgd_loop.h; the
// optimizer, train/optimizer.cc). Without LibTorch's headers:
// train/fused_sgd_avx2.cc, compiled for AVX2, includes this and ATen's
// vector header only, so that no inline function of LibTorch's gets an AVX2
// copy another file could link against.

#include <cstdint>

namespace cohort::train::detail {

// One parameter's arrays, element k of each beside element k of the others.
struct SgdArrays {
  float* param = nullptr;
  const float* grad = nullptr;
  float* momentumBuffer = nullptr;  // nullptr: SGD without momentum
};

// The scalars of one parameter's step, rounded to float as ATen's float
// kernels round them.
struct SgdScalars {
  float lr = 0, weightDecay = 0, momentum = 0;
  float keep = 1;          // 1 - dampening
  bool nesterov = false;
  bool firstStep = false;  // the buffer starts as the gradient (LibTorch's first step)
};

// Steps elements [begin, end). No allocation, no threads. With AVX2 and FMA
// instructions on a CPU that has them (sgdUpdateAvx2, x86-64);
// sgdUpdateBaseline is the build's baseline loop, for tests.
void sgdUpdate(const SgdArrays& a, const SgdScalars& s, int64_t begin, int64_t end);
void sgdUpdateAvx2(const SgdArrays& a, const SgdScalars& s, int64_t begin, int64_t end);
void sgdUpdateBaseline(const SgdArrays& a, const SgdScalars& s, int64_t begin, int64_t end);

}  // namespace cohort::train::detail
