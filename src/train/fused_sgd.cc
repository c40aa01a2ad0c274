// sgdUpdate: the widest build of the SGD loop (train/detail/fused_sgd_loop.h)
// this CPU runs.

#include "train/detail/fused_sgd_loop.h"

namespace cohort::train::detail {

void sgdUpdateBaseline(const SgdArrays& a, const SgdScalars& s, int64_t begin, int64_t end) {
  sgdLoop(a, s, begin, end);
}

void sgdUpdate(const SgdArrays& a, const SgdScalars& s, int64_t begin, int64_t end) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) {
    sgdUpdateAvx2(a, s, begin, end);
    return;
  }
#endif
  sgdLoop(a, s, begin, end);
}

}  // namespace cohort::train::detail
