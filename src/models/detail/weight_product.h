#pragma once

// y [m, out] = x [m, in] W^T (+ bias), W stored [out, in] as linear layers
// and convolutions keep their weights, through oneDNN's sgemm
// (core/sgemm.h); x and W dense rows. Linear layers (models/linear.cc) and
// the convolutions taken as products (models/window_conv.h,
// models/gemm_conv.h) run their forward through it.
//
// For a few dozen rows (16 <= m < 128) it computes y^T = W x^T and
// transposes that. oneDNN 2.6's (N, T) sgemm of so few rows ran on what
// one thread does: on the AMD EPYC of docs/benchmarks.md, 2 threads, the
// operator profile of ResNet-50 at 64 px (`cohort run --profile`) had the
// unfolded convolutions' forward products at 16.2 ms a step against 8.3
// and 8.6 for their two gradient products, which do the same arithmetic.
// The transpose of [out, m] costs little beside it. Fewer rows (decoding)
// and more took the (N, T) product as fast or faster. `name`: what profilers
// see (x, W) as; monitor/operator_table.cc counts its FLOPs.

#include <ATen/core/Tensor.h>

namespace cohort::models::detail {

at::Tensor weightProduct(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const char* name);

}  // namespace cohort::models::detail
