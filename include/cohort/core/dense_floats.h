#pragma once

// Whether two tensors can be walked as two plain float arrays, element k of
// one beside element k of the other: both float32 on the CPU, with the same
// sizes and strides over one dense, non-overlapping block each (any order of
// dimensions, e.g. channels-last). The single-pass loops over raw pointers
// (the fused SGD step, the checked gradient copy) take only such pairs.

#include <ATen/core/Tensor.h>

namespace cohort {

inline bool denseFloatTwins(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.device().is_cpu() &&
         b.device().is_cpu() && a.is_non_overlapping_and_dense() && a.sizes() == b.sizes() &&
         a.strides() == b.strides();
}

}  // namespace cohort
