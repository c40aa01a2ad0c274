#pragma once

// A gradient bucket's sum over a process group, with the gradients on the
// wire as they are, or rounded to 16 bits (DdpOptions::compression):
//
//   launch:    sum     wire = half(flat); allreduce(wire)     (Gloo sums in fp16)
//              gather  wire = [ranks][n]; allgather(16-bit flat)
//   complete:  sum     flat = float(wire)
//              gather  flat = sum of float(wire[r]) over r = 0, 1, ... in
//                      order, the same on every rank
//
// bf16 is always gathered over Gloo: LibTorch 1.13's Gloo has no bfloat16
// type, so its bits travel as fp16, which a gather moves without
// arithmetic. fp16 is gathered too between 2 ranks, where a gather moves
// exactly the bytes of a ring allreduce (n x 2 bytes each way) and the sum
// is one vectorized float32 add instead of Gloo's element-by-element fp16
// arithmetic (ResNet-18 between 2 ranks on loopback: 72-75 ms of exposed
// exchange per step gathered, 93-97 ms summed by Gloo, 28-31 ms without
// compression). From 3 ranks on Gloo sums fp16:
// a gather moves (ranks - 1) x n x 2 bytes to each rank, a ring allreduce
// 2 (ranks - 1) / ranks x n x 2.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "cohort/parallel/ddp.h"

namespace cohort::parallel::detail {

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

}  // namespace cohort::parallel::detail
