#pragma once

// Copying a gradient autograd produced into its bucket slot, checking on
// the way that every element is finite: the copy reads each element once
// anyway, so the check costs no pass over memory of its own. Without a
// bucket, the check alone.

#include <ATen/core/Tensor.h>

#include <optional>

namespace cohort::parallel::detail {

// dst.copy_(src); whether every element of src is finite (no NaN or Inf),
// when the copy could check it (float32 on the CPU, both dense with the
// same strides); otherwise nullopt, unchecked.
std::optional<bool> copyCheckingFinite(at::Tensor& dst, const at::Tensor& src);

// Whether every element of t is finite, read once and not copied (one
// replica keeps its gradients where autograd put them); nullopt, unchecked,
// unless t is dense float32 on the CPU.
std::optional<bool> allFinite(const at::Tensor& t);

}  // namespace cohort::parallel::detail
