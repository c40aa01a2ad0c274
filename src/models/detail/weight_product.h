#pragma once

// y [m, out] = x [m, in] W^T (+ bias), W stored [out, in] as linear layers
// and convolutions keep their weights, through oneDNN's sgemm
// (core/sgemm.h); x and W dense rows. Linear layers (models/linear.cc) and
// the convolutions taken as products (models/window_conv.h,
// models/gemm_conv.h) run their forward through it.
//
// With `transposeFewRows`, a product of a few dozen rows (16 <= m < 128)
// computes y^T = W x^T and transposes that. oneDNN 2.6's (N, T) sgemm of so
// few rows ran at what one thread does: on the AMD EPYC of
// docs/benchmarks.md, 2 threads, the operator profile of ResNet-50 at
// 64 px (`cohort run --profile`) had the unfolded convolutions' forward
// products at 16.2 ms a step against 8.3 and 8.6 for their two gradient
// products, which do the same arithmetic. The transpose of [out, m] costs
// little beside it. Fewer rows (decoding) and more took the (N, T) product
// as fast or faster. The convolutions take it; linear layers do not: the
// two products sum a row in different orders, and a linear layer's rows
// must come out bitwise alike however a batch is split (one process
// against data-parallel ranks, serving's batches), which the convolutions'
// per-shape choice does not promise anyway. `name`: what profilers see
// (x, W) as; monitor/operator_table.cc counts its FLOPs.

#include <ATen/core/Tensor.h>

namespace cohort::models::detail {

at::Tensor weightProduct(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const char* name,
                         bool transposeFewRows);

}  // namespace cohort::models::detail
