#pragma once

// What the readers of ZeRO parts share (ckpt/zero_state.h lays parts out).

#include <ATen/core/Tensor.h>

namespace cohort::ckpt::detail {

// The state kinds a parameter can have per element; "step" is a count.
inline constexpr const char* kElementKinds[] = {"exp_avg", "exp_avg_sq", "momentum_buffer"};

// A tensor's elements in memory order, as a 1-D view (its memory is dense).
inline at::Tensor memoryOrder(const at::Tensor& t) {
  return t.as_strided({t.numel()}, {1}, t.storage_offset());
}

}  // namespace cohort::ckpt::detail
