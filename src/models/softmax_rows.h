#pragma once

// The softmax's row operations of the blockwise attention
// (models/flash_attention.cc) in float32: the largest score of a row, and
// exp of the row shifted by its maximum (or its logsumexp) with the sum of
// the results. Each comes as a scalar loop and as AVX2+FMA and AVX-512
// code (intrinsics in functions compiled for those instruction sets;
// cohort itself is compiled for baseline x86-64, and there the compiler
// left the scalar loops scalar). The calls take the build the fused
// kernels take (models/fused_kernels.h), which ATEN_CPU_CAPABILITY holds
// as it holds LibTorch's.

#include <cstdint>

namespace cohort::models::detail {

// 0: the scalar loops, 1: AVX2 with FMA, 2: AVX-512 (F). The caller of an
// explicit build checks that the CPU has it.
enum class RowBuild { scalar = 0, avx2 = 1, avx512 = 2 };

// The build the calls without one take here.
RowBuild softmaxRowBuild();

// The largest of x[0..n): -inf for n 0.
float rowMax(const float* x, int64_t n);
float rowMax(RowBuild build, const float* x, int64_t n);

// x[i] = exp(x[i] - shift) for i < n and x[i] <= shift, and their sum.
// Cephes' expf (2^k p(r), |r| <= ln 2 / 2), within 2 ulp of std::exp down
// to -87, and exp(-87) = 1.6e-38 (a normal float) below.
float expShiftedInPlace(float* x, int64_t n, float shift);
float expShiftedInPlace(RowBuild build, float* x, int64_t n, float shift);

}  // namespace cohort::models::detail
