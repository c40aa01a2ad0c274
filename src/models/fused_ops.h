#pragma once

// The fused training ops' internals (cohort/models/fused_ops.h is the API):
// which tensors the fused kernels take, and the fused paths alone.

#include <ATen/core/Tensor.h>

#include <initializer_list>

#include "cohort/models/fused_ops.h"

namespace cohort::models::detail {

// Whether the fused kernels take these tensors (cohort/models/fused_ops.h;
// whether fused ops are on aside); undefined ones are skipped.
bool fusedKernelsTake(std::initializer_list<at::Tensor> tensors);

// The fused paths alone, for tests and benchmarks: they throw
// c10::Error when fusedKernelsTake() is false for their tensors.
at::Tensor biasGeluFused(const at::Tensor& h, const at::Tensor& bias, bool tanh);
AddNorm addLayerNormFused(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                          const at::Tensor& bias, double eps);
// Training-mode batch norm and ReLU, running statistics updated in place:
// running = (1 - momentum) * running + momentum * batch (variance unbiased).
at::Tensor batchNormReluFused(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const at::Tensor& runningMean, const at::Tensor& runningVar, double momentum,
                              double eps);

// GELU of bfloat16 h without a bias (what bf16 autocast's linear layers
// give: the bias already added), its slope kept in bfloat16: whether it
// takes h, and the path alone (throws c10::Error unless it does).
bool geluBf16Takes(const at::Tensor& h, const at::Tensor& bias);
at::Tensor geluBf16Fused(const at::Tensor& h, bool tanh);

// The fused causal softmax alone (cohort/models/fused_ops.h): throws
// c10::Error unless causalSoftmaxTakes(scores).
bool causalSoftmaxTakes(const at::Tensor& scores);
at::Tensor causalSoftmaxFused(const at::Tensor& scores);

// Counts a fused call (fusedOpCalls()).
void countFusedCall();

}  // namespace cohort::models::detail
