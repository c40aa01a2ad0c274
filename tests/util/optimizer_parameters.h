#pragma once

// Parameters the optimizer tests step: a plain float32 one, a channels-last
// convolution weight and a double one (which the fused loops do not take),
// with gradients required, from seed 3.

#include <torch/torch.h>

#include <vector>

namespace cohort::test {

inline std::vector<at::Tensor> optimizerParameters() {
  torch::manual_seed(3);
  std::vector<at::Tensor> ps;
  ps.push_back(torch::randn({37, 11}));
  ps.push_back(torch::randn({8, 3, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast));
  ps.push_back(torch::randn({13}, torch::kFloat64));
  for (auto& p : ps) p.set_requires_grad(true);
  return ps;
}

}  // namespace cohort::test
