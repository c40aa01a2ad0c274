#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "cohort/config/job.h"

namespace cohort::train {

// SGD (momentum, Nesterov, L2 weight decay) or AdamW (decoupled decay).
std::unique_ptr<torch::optim::Optimizer> createOptimizer(const OptimizerConfig& config,
                                                         std::vector<at::Tensor> parameters);

// Bytes of the optimizer's state tensors (momentum buffers, AdamW's
// averages) this process holds.
int64_t optimizerStateBytes(torch::optim::Optimizer& optimizer);

// Sets the learning rate of every parameter group.
void setLearningRate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace cohort::train

namespace cohort::train {

// The optimizer's per-parameter state as named tensors, parameters named by
// `names` (in the order the optimizer holds them): "<param>.momentum_buffer"
// (sgd), "<param>.exp_avg", "<param>.exp_avg_sq", "<param>.step" (adamw).
// Tensors are the live ones, not copies (the step counts are fresh scalars).
std::vector<std::pair<std::string, at::Tensor>> optimizerState(
    torch::optim::Optimizer& optimizer, const std::vector<std::string>& names);

// optimizerState() for a checkpoint at every step: the optimizer's state
// map is searched (by a key formatted from each parameter's address) only
// when the set of states changed; otherwise the cached tensors are returned,
// with the adamw step counts brought up to date.
class OptimizerStateCache {
 public:
  OptimizerStateCache(torch::optim::Optimizer& optimizer, std::vector<std::string> names);
  const std::vector<std::pair<std::string, at::Tensor>>& get();
  // Changes whenever get() rebuilt its list (new tensors or names).
  uint64_t generation() const { return generation_; }

 private:
  uint64_t generation_ = 0;
  torch::optim::Optimizer& optimizer_;
  std::vector<std::string> names_;
  size_t count_ = static_cast<size_t>(-1);
  std::vector<std::pair<std::string, at::Tensor>> items_;
  std::vector<std::pair<const torch::optim::OptimizerParamState*, at::Tensor>> steps_;
};

// Restores what optimizerState() returned. Throws DataError naming `origin`
// and the first missing, unexpected or wrong-shaped entry.
void loadOptimizerState(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                        const std::vector<std::pair<std::string, at::Tensor>>& state,
                        const std::string& origin);

}  // namespace cohort::train
