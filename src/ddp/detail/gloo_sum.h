#pragma once

// A gradient bucket's sum over a process group, with the gradients on the
// wire as they are, or rounded to 16 bits (DdpOptions::compression):
//
//   launch:   fp16  wire = half(flat); allreduce(wire)        (Gloo sums in fp16)
//             bf16  wire = [ranks][n]; allgather(bf16(flat))  (Gloo 1.13 has no
//                   bfloat16 type: its bits travel as fp16, which a gather
//                   moves without arithmetic)
//   complete: fp16  flat = float(wire)
//             bf16  flat = sum of float(wire[r]) over r = 0, 1, ... in order,
//                   the same on every rank
//
// An allgather moves (ranks - 1) x n x 2 bytes to each rank, a ring
// allreduce 2 (ranks - 1) / ranks x n x bytes per value: bf16 sends less
// than float32 up to 3 ranks, as much at 4, more beyond.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "cohort/ddp/ddp.h"

namespace cohort::ddp::detail {

struct GlooSum {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor wire;  // what travels, when compressed
  DdpOptions::Compression compression = DdpOptions::Compression::none;
};

// Starts the sum of `flat` over `pg` (in place when not compressed); returns
// at once. Only float32 buckets are compressed.
GlooSum launchSum(c10d::ProcessGroup& pg, at::Tensor& flat, DdpOptions::Compression compression);

// After sum.work completed: writes a compressed sum into `flat`.
void completeSum(at::Tensor& flat, const GlooSum& sum);

}  // namespace cohort::ddp::detail
