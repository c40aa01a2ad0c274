#pragma once

// Fused elementwise ops of training: each replaces a chain of ATen ops by
// one pass over memory forward and one or two backward (autograd functions
// over the loops of src/models/fused_kernels.h). They compute what the chains
// compute, to rounding (tests/models/fused_ops_test.cc states the
// tolerances); docs/performance.md "Fused kernels" has what each saves.
//
// Each op takes the fused path only while fused ops are on (fusedOpsOn())
// and for CPU tensors of float32 or float64, all of one dtype, with
// autocast off (and bfloat16 as biasGelu and causalSoftmax say); otherwise (CUDA, other dtypes, mixed dtypes, autocast) it runs the ATen
// ops it replaces. Their backwards are not differentiable again
// (no double backward), and a trace (TorchScript, ONNX) of a model would
// hold them as opaque functions: export with fused ops off.
//
// On by default where the CPU runs a vector build of the loops (AVX2 or
// AVX-512, src/models/fused_kernels.h): there add + LayerNorm and BatchNorm +
// ReLU measured faster than the ATen ops, and GELU with its slope kept faster
// than ATen's GELU and its backward (docs/performance.md "Fused kernels").
// The baseline build was slower: without AVX2 they stay off, as with
// COHORT_FUSED_OPS=off. The detail:: entry points for tests and benchmarks are
// in src/models/fused_ops.h.

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/batchnorm.h>

#include <cstdint>
#include <string>

namespace cohort::models {

// gelu(h + bias), h [..., n], bias [n] or undefined (gelu(h)); tanh: GELU's
// tanh approximation. The fused path computes GELU's slope in the same pass
// and keeps it, in place of h, for a backward of one product. A bfloat16 h
// without a bias (what bf16 autocast's linear layers give) takes it too,
// autocast on or off: computed in float32, y and the slope each rounded
// to bfloat16 once.
at::Tensor biasGelu(const at::Tensor& h, const at::Tensor& bias, bool tanh);

// s = x + delta and layer_norm(s) over the last dimension (weight [n],
// bias [n] or undefined), as one op: a transformer block's residual add and
// the LayerNorm after it. Under CPU autocast to bfloat16, a float32 x and a
// bfloat16 delta (the branch's linear layer's output) take it too: delta
// widened exactly, then the float32 op, s and the norm in float32 as
// autocast's add and layer_norm give them.
struct AddNorm {
  at::Tensor sum;   // s
  at::Tensor norm;  // layer_norm(s)
};
AddNorm addLayerNorm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, const at::Tensor& bias,
                     double eps);

// relu(bn(x)) for x [N, C, H, W]. In training mode, fused: batch statistics,
// bn's running statistics and num_batches_tracked updated as
// BatchNorm2d::forward updates them. In eval mode, or without affine
// parameters or running statistics, bn's own forward then relu.
at::Tensor batchNormRelu(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x);

// softmax(scores, -1) of causal attention scores [..., Q, T] (Q <= T; the
// Q queries the last Q of the T positions, Q = T the square matrix) whose
// values past each query's position are -inf (as the product that adds
// the causal mask writes them): row i of each matrix over its first
// T - Q + i + 1 values, the rest 0. The fused path, for bfloat16 CPU
// scores (what autocast makes; autocast on or off), reads and computes only
// those values, in float32, and keeps its output for a backward of one
// pass. Float32 scores take ATen's softmax: the fused loop measured slower
// in backward there, and float32 attention without dropout is blockwise
// anyway (models/flash_attention.h).
at::Tensor causalSoftmax(const at::Tensor& scores);

// Fused calls made in this process (the ops above): tests check a model
// takes the fused path.
int64_t fusedOpCalls();

// Whether the ops above take the fused path on this thread: what the
// innermost FusedOpsScope says, else fusedOpsByDefault().
bool fusedOpsOn();

// Whether fused ops are on outside any FusedOpsScope: a vector build of the
// loops runs here and COHORT_FUSED_OPS is not "off" (which throws
// ConfigError on a value other than auto or off).
bool fusedOpsByDefault();

// What fusedOpsByDefault() chose, for the run's summary (compute.fused_ops):
// "avx512" or "avx2" (the build of the loops that runs), "off
// (COHORT_FUSED_OPS)" or "off (no AVX2)". Throws ConfigError as above.
std::string fusedOpsDescription();

// While it lives, fusedOpsOn() is `on` on this thread: tests and
// benchmarks compare a model's two paths.
class FusedOpsScope {
 public:
  explicit FusedOpsScope(bool on);
  ~FusedOpsScope();
  FusedOpsScope(const FusedOpsScope&) = delete;
  FusedOpsScope& operator=(const FusedOpsScope&) = delete;

 private:
  int before_;
};

}  // namespace cohort::models
