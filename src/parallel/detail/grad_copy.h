#pragma once

// Copying a gradient autograd produced into its bucket slot, checking on
// the way that every element is finite: the copy reads each element once
// anyway, so the check costs no pass over memory of its own.

#include <ATen/core/Tensor.h>

#include <optional>

namespace cohort::parallel::detail {

// dst.copy_(src); whether every element of src is finite (no NaN or Inf),
// when the copy could check it (float32 on the CPU, both dense with the
// same strides); otherwise nullopt, unchecked.
std::optional<bool> copyCheckingFinite(at::Tensor& dst, const at::Tensor& src);

}  // namespace cohort::parallel::detail
