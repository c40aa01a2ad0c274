#pragma once

// cohort's own CPU loops beside LibTorch's kernels, as a run reports them
// (summary.json compute): which build the fused training ops take.

#include <string>

namespace cohort::models {

// The fused training ops outside any FusedOpsScope (src/models/fused_ops.h):
// "avx512" or "avx2" (the build of their loops that runs), "off
// (COHORT_FUSED_OPS)" or "off (no AVX2)". Throws ConfigError when
// COHORT_FUSED_OPS is neither auto nor off.
std::string fusedOpsDescription();

}  // namespace cohort::models
