#include "parallel/detail/grad_copy.h"

#include <ATen/Parallel.h>
#include <ATen/ops/copy.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "cohort/core/dense_floats.h"

namespace cohort::parallel::detail {

std::optional<bool> copyCheckingFinite(at::Tensor& dst, const at::Tensor& src) {
  if (!denseFloatTwins(dst, src)) {
    dst.copy_(src);
    return std::nullopt;
  }
  // Element k of one beside element k of the other. A float is NaN or Inf exactly when its
  // exponent bits are all ones: the largest exponent seen tells.
  constexpr uint32_t kExponent = 0x7f800000u;
  float* const out = dst.data_ptr<float>();
  const float* const in = src.data_ptr<float>();
  std::atomic<bool> finite{true};
  at::parallel_for(0, src.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    float* __restrict__ o = out;
    const float* __restrict__ i = in;
    uint32_t largest = 0;
    for (int64_t k = begin; k < end; ++k) {
      const float v = i[k];
      o[k] = v;
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      bits &= kExponent;
      largest = bits > largest ? bits : largest;
    }
    if (largest == kExponent) finite.store(false, std::memory_order_relaxed);
  });
  return finite.load();
}

}  // namespace cohort::parallel::detail
