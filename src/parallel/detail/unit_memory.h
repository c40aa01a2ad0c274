#pragma once

// Memory for ZeRO's short-lived whole-unit buffers on the CPU: a unit's
// gathered parameters and full gradients (stage 3), a bucket's gradients
// and reduce-scatter receive buffer (stages 2, 3). They are allocated and
// freed many times a step, several MB each, between long-lived allocations
// (activations saved for backward, optimizer state): from glibc's heap the
// freed ones leave holes the heap keeps, and a rank's resident memory grew
// by about two copies of the whole model in its first step (measured: 1139
// MB peak against 515 MB from mapped memory, 4 ranks, a GPT of 83M
// parameters). These are mapped from the kernel instead and unmapped when
// freed, but for a few blocks of each size kept for the next unit.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace cohort::parallel::detail {

// An uninitialized 1-D tensor of `n` elements of `options`: on the CPU in
// such memory (allocateStorage() of models/unit_runner.h allocates it there
// again after a release), elsewhere from the device's own allocator.
at::Tensor unitBuffer(int64_t n, const at::TensorOptions& options);

}  // namespace cohort::parallel::detail
