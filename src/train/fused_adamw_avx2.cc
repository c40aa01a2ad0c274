// adamwUpdate's loop with ATen's AVX2 Vectorized<float> (cmake/cpu_kernels.cmake
// gives this file -mavx2 -mfma and ATen's CPU_CAPABILITY_AVX2): the same
// intrinsics as ATen's own AVX2 kernels, fused multiply-add included. The
// build's baseline (x86-64) has only ATen's generic Vectorized<float>, which
// GCC leaves to scalar square roots and divisions: slower than the memory
// traffic the fusion saves. train/fused_adamw.cc calls this only on a CPU
// with AVX2 and FMA.

#include "train/detail/fused_adamw_loop.h"

namespace cohort::train::detail {

#if defined(__x86_64__)
void adamwUpdateAvx2(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end) {
  adamwLoop(a, s, begin, end);
}
#endif

}  // namespace cohort::train::detail
