#pragma once

// Elements [i, i + n) of float arrays as one ATen vector, for the fused
// optimizers' loops (train/detail/fused_adamw_loop.h, fused_sgd_loop.h).
// kPartial: n < Vec::size(), loads and stores of n elements; otherwise n is
// Vec::size() and they are whole vectors, constant-sized copies the
// compiler turns into vector moves. Internal linkage, as those loops: each
// file that includes it compiles it for its own instructions.

#include <cstdint>

namespace cohort::train::detail {
namespace {

template <typename Vec, bool kPartial>
struct VectorSlot {
  int64_t i, n;
  __attribute__((always_inline)) Vec load(const float* x) const {
    return kPartial ? Vec::loadu(x + i, n) : Vec::loadu(x + i);
  }
  __attribute__((always_inline)) void store(const Vec& v, float* x) const {
    if constexpr (kPartial) {
      v.store(x + i, static_cast<int>(n));
    } else {
      v.store(x + i);
    }
  }
};

}  // namespace
}  // namespace cohort::train::detail
