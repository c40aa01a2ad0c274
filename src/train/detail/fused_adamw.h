#pragma once

// AdamW in one pass over each parameter's memory (createOptimizer's adamw).
//
// LibTorch's AdamW::step runs nine ATen operations per parameter (decay,
// two for each average, sqrt, divide, add, addcdiv), each a pass over the
// parameter's size, and allocates two temporaries: about 23 reads and
// writes of it. The step is memory-bound, so doing the same arithmetic
// element by element, reading the parameter, its gradient and the two
// averages once and writing the parameter and the averages once (7), is
// that much faster. The parameters of a group are walked as one flat range
// split over LibTorch's threads, so that a model of many small tensors pays
// one parallel region per group, not one per tensor.
//
// The arithmetic is LibTorch 1.13's, operation by operation, in float with
// the scalars rounded to float as ATen's float kernels round them:
//
//   p = p * (1 - lr*wd)
//   m = fmadd(g, 1-b1, m*b1)              (add_ with alpha: ATen's fmadd)
//   v = v*b2 + ((1-b2)*g)*g               (addcmul_)
//   vmax = maximum(vmax, v)               (amsgrad; denominators use vmax)
//   d = sqrt(v) / sqrt(1-b2^step) + eps
//   p = p + (-(lr / (1-b1^step)) * m) / d (addcdiv_)
//
// so results agree with torch::optim::AdamW to float rounding. With ATen's
// AVX2 vectors (a CPU with AVX2 and FMA) the roundings are those of ATen's
// own AVX2 and AVX-512 kernels: bitwise equal results on the machine of
// docs/performance.md. With the generic vectors a multiply-add may round
// twice; tests/train/fused_adamw_test.cc bounds the difference either way.

#include <torch/optim/adamw.h>

#include <cstdint>
#include <vector>

#include "train/detail/fused_adamw_arrays.h"

namespace cohort::train::detail {

// The scalars for options `o` at `step` (1 at the first step, as
// AdamWParamState::step() after its increment).
AdamWScalars adamwScalars(const torch::optim::AdamWOptions& o, int64_t step);

struct AdamWTask {
  AdamWArrays arrays;
  AdamWScalars scalars;
};

// Steps every element of every task: the tasks' elements as one range, cut
// into pieces of at least `grain` elements run on at::parallel_for's threads
// (one region for all tasks; on the calling thread only when the total is
// below `grain`). Arrays of different tasks must not overlap.
void adamwMultiTensor(const std::vector<AdamWTask>& tasks, int64_t grain = 1 << 15);

// torch::optim::AdamW with the step above for each parameter that is, with
// its gradient and state, float32 dense CPU memory laid out alike
// (denseFloatTwins); any other parameter (another dtype or device, a sparse
// gradient: an error as in LibTorch, a gradient laid out otherwise) takes
// LibTorch's operations, per parameter, so it gets exactly AdamW's result.
// The state is LibTorch's AdamWParamState under LibTorch's keys:
// checkpoints, loadOptimizerState and optimizerState() see no difference.
// A restored state tensor laid out unlike its parameter (a checkpoint's
// contiguous copy of a channels-last weight's average) is relaid in place
// (Tensor::set_, the same tensor object, so that references to it held by
// OptimizerStateCache stay live) at the first step that finds it.
class FusedAdamW final : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace cohort::train::detail
