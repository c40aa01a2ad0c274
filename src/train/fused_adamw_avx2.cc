// adamwUpdate's loop compiled for AVX2 and FMA (src/CMakeLists.txt gives
// this file -mavx2 -mfma). ATen's generic Vectorized<float> (8 floats: its
// AVX2 specialization needs SLEEF's headers, which Debian's LibTorch does
// not ship) becomes 8-wide instructions here (vsqrtps, vdivps, vfmadd),
// where the build's baseline (x86-64, SSE2) leaves it to scalar square
// roots and divisions that cost about what the fusion saves in memory
// traffic. train/fused_adamw.cc calls it only on a CPU with AVX2 and FMA.

#include "train/detail/fused_adamw_loop.h"

namespace cohort::train::detail {

#if defined(__x86_64__)
void adamwUpdateAvx2(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end) {
  adamwLoop(a, s, begin, end);
}
#endif

}  // namespace cohort::train::detail
