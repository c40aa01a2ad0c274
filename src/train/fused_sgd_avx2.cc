// sgdUpdate's loop with ATen's AVX2 Vectorized<float> (cmake/cpu_kernels.cmake
// gives this file -mavx2 -mfma and ATen's CPU_CAPABILITY_AVX2), fused
// multiply-add included. At the build's baseline (SSE2, no FMA) the loop
// was bound by its own arithmetic: ResNet-50's 25.6 M parameters took
// 13.9 ms a step on one thread, 9.0 with AVX2 and FMA. train/fused_sgd.cc
// calls this only on a CPU with AVX2 and FMA.

#include "train/detail/fused_sgd_loop.h"

namespace cohort::train::detail {

#if defined(__x86_64__)
void sgdUpdateAvx2(const SgdArrays& a, const SgdScalars& s, int64_t begin, int64_t end) { sgdLoop(a, s, begin, end); }
#endif

}  // namespace cohort::train::detail
