#pragma once

// Activation recomputation (model.recompute): a part of the network whose
// activations are dropped in forward and computed again in backward.

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace cohort::models {

// Returns f(x) without keeping f's activations: only x is saved, and in
// backward f runs again on it with gradients on, and its gradients flow from
// there (into the parameters' .grad, then on to x), as PyTorch's reentrant
// torch.utils.checkpoint does. The recomputation sees the state the forward
// saw: the CPU random generator (so dropout drops the same values), autocast
// on or off with its dtype, and `buffers` (BatchNorm statistics, which the
// second forward would otherwise update twice) are put back as they were
// after the forward. Only when gradients are being recorded; otherwise it is
// f(x).
//
// Untested on CUDA: the CUDA generator is not restored, so dropout on a GPU
// would drop other values in the recomputation.
at::Tensor recomputed(std::function<at::Tensor(const at::Tensor&)> f, const at::Tensor& x,
                      std::vector<at::Tensor> buffers = {});

}  // namespace cohort::models
