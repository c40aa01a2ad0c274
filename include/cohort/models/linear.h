#pragma once

// The matrix products of linear layers: y = x W^T + b.
//
// On the CPU in float32 they run as oneDNN's sgemm (core/sgemm.h) forward and backward, instead of ATen's addmm,
// which goes to the BLAS LibTorch was built with (OpenBLAS in Debian's
// LibTorch). oneDNN picks its kernels from the CPU it runs on (AVX-512 where
// there is AVX-512, held by ONEDNN_MAX_CPU_ISA), whatever BLAS's own choice
// of kernels is (OPENBLAS_CORETYPE can hold OpenBLAS to AVX2 on a CPU with
// AVX-512), and its products of few rows (decoding: 1 to 8) were 2-5x ATen's
// (docs/performance.md "Linear layers through oneDNN"). Results change by
// float rounding only (tests/models/linear_test.cc). Without gradients to
// keep (inference) the product runs without an autograd node.
//
// Other tensors (CUDA, bfloat16, float64, autocast on) take LibTorch's
// torch::nn::functional::linear (nn::Linear's forward), and so does every
// linear layer while oneDNN is off (compute.onednn: off, which
// clears LibTorch's userEnabledMkldnn) or COHORT_GEMM=aten is set, to
// compare the two. The backward is differentiable again (double backward) through ATen
// ops when the graph of the gradients is kept (create_graph).
//
// Under CPU autocast to bfloat16, on inputs of 3 or more dimensions,
// LibTorch's product comes back in bfloat16 and its float32 bias is added
// by cohort's kernel (models/fused_kernels.h): the bits of the mixed-dtype
// `output += bias` LibTorch's C++ linear runs there, in one vectorized
// pass. The bias's gradient is summed in float32 straight into the float32
// bias, where ATen sums in bfloat16 and autocast's cast widens it back.
//
// Profilers see the products as "cohort::linear" (x [m, in], W [out, in]),
// "cohort::linear_grad_input" (dy [m, out], W) and
// "cohort::linear_grad_weight" (dy, x), each 2 m in out FLOPs
// (monitor/profiler.h counts them).
//
// A trace of a model (TorchScript, ONNX) would hold the oneDNN products as
// opaque functions: cohort's exporters write their own graphs and do not
// trace (serve/graph_ops.cc).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace cohort::models {

// x [..., in], weight [out, in], bias [out] or undefined: [..., out].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// Whether linear() takes oneDNN for CPU float32 tensors here: COHORT_GEMM is
// unset or "auto" (it throws ConfigError on a value other than auto or
// aten).
bool oneDnnLinearOn();

// What linear() takes for CPU float32 tensors now, for the run's summary
// (compute.gemm): "onednn", "aten (COHORT_GEMM)" or "aten (compute.onednn
// off)".
std::string linearGemmDescription();

// Whether oneDNN's products take t here: a CPU float32 strided tensor,
// with oneDnnLinearOn(), oneDNN on (compute.onednn) and autocast off.
bool oneDnnProductsTake(const at::Tensor& t);

// Calls of linear() that took oneDNN in this process: tests check a model
// takes it.
int64_t oneDnnLinearCalls();

}  // namespace cohort::models
