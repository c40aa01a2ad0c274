#pragma once

// Whether two tensors can be walked as two plain float arrays, element k of
// one beside element k of the other: both float32 on the CPU, with the same
// sizes and strides over one dense, non-overlapping block each (any order of
// dimensions, e.g. channels-last). The stride of a dimension of size 1 never
// moves an address, so it may differ: a 1x1 convolution's channels-last
// weight [512, 256, 1, 1] (strides 256, 1, 256, 256) and its gradient
// (256, 1, 1, 1) are twins. The single-pass loops over raw pointers (the
// fused SGD and AdamW steps, the checked gradient copy) take only such pairs.

#include <ATen/core/Tensor.h>

namespace cohort {

inline bool denseFloatTwins(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat || !a.device().is_cpu() ||
      !b.device().is_cpu() || !a.is_non_overlapping_and_dense() || a.sizes() != b.sizes()) {
    return false;
  }
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) != 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

}  // namespace cohort
