#pragma once

// y [m, out] = x [m, in] W^T (+ bias), W stored [out, in] as linear layers
// and convolutions keep their weights, through oneDNN's sgemm
// (core/sgemm.h); x and W dense rows. Linear layers (models/linear.cc) and
// the convolutions taken as products (models/window_conv.h,
// models/gemm_conv.h) run their forward through it.
//
// For the convolutions, a product of a few dozen rows (16 <= m < 128)
// computes y^T = W x^T and transposes that. oneDNN 2.6's (N, T) sgemm of so
// few rows ran at what one thread does: on the AMD EPYC of
// docs/benchmarks.md, 2 threads, the operator profile of ResNet-50 at
// 64 px (`cohort run --profile`) had the unfolded convolutions' forward
// products at 16.2 ms a step against 8.3 and 8.6 for their two gradient
// products, which do the same arithmetic. The transpose of [out, m] costs
// little beside it. Fewer rows (decoding) and more took the (N, T) product
// as fast or faster. The convolutions take it; linear layers do not: the
// two products sum a row in different orders, and a linear layer's rows
// come out bitwise alike however a batch of 16 to 2047 rows, or of 2048 or
// more, is split (one process against data-parallel ranks, serving's
// batches), which the convolutions' per-shape choice does not promise
// anyway (nor does oneDNN below 16 rows, where it takes other kernels:
// tests/models/linear_test.cc).
//
// For linear layers, from kRowsForTransposedWeight rows on (training's
// batches of sequences), the product is x W^T with W copied transposed
// first, oneDNN's (N, N) form: 261-272 GFLOP/s against 252-257 for (N, T)
// on the GPT example's shapes on one EPYC core (4096 rows; a throwaway
// program calling dnnl_sgemm), and the example's MFU 1.6 points higher on
// average (3 pairs of `cohort run`, alternating with COHORT_GEMM=onednn-nt,
// which holds every forward to (N, T); docs/performance.md). The copy
// reads and writes W once: at 2048 rows that is at most 3% of the
// product's time even for a W read from memory (0.5 ns an element against
// 16 ns of products); with fewer rows it would eat the gain. The two forms
// may round differently: on that EPYC they gave the same bits on the
// example's shapes; held to AVX2, 457 of the 524,288 values of a 4096 x 512
// x 128 product differed.
//
// The bias is added to y's rows in one pass of models/fused_kernels.h's
// addToRows (bitwise y.add_(bias)).
//
// `name`: what profilers see (x, W) as; monitor/operator_table.cc counts
// its FLOPs.

#include <ATen/core/Tensor.h>

namespace cohort::models::detail {

constexpr int64_t kRowsForTransposedWeight = 2048;

// How a product chooses its form: the convolutions transpose the result
// of few rows, linear layers transpose the weight for many.
enum class WeightProductForm { convolution, linear };

at::Tensor weightProduct(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const char* name,
                         WeightProductForm form);

// The bias's gradient from the output's, g [m, out]: g summed over its rows
// (models/fused_kernels.h's columnSums for CPU float32 and float64: one
// pass in blocks of rows, where ATen's sum over dimension 0 took 3.2 ms for
// the GPT example's [4096, 512] on one EPYC core; else, and for a g whose
// graph is kept, g.sum(0)).
at::Tensor biasGradient(const at::Tensor& g);

}  // namespace cohort::models::detail
