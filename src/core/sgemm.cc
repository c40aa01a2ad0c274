#include "cohort/core/sgemm.h"

#include <dnnl.h>
#include <fmt/format.h>

#include "cohort/core/error.h"

namespace cohort {

void oneDnnSgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t s =
      dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (s != dnnl_success) {
    throw Error(fmt::format("oneDNN sgemm of [{}, {}] x [{}, {}] failed with status {}", m, k, k, n,
                            static_cast<int>(s)));
  }
}

}  // namespace cohort
