#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "cohort/config/job.h"

namespace cohort::train {

// SGD (momentum, Nesterov, L2 weight decay) or AdamW (decoupled decay).
std::unique_ptr<torch::optim::Optimizer> createOptimizer(const OptimizerConfig& config,
                                                         std::vector<at::Tensor> parameters);

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

// Restores what optimizerState() returned. Throws DataError naming `origin`
// and the first missing, unexpected or wrong-shaped entry.
void loadOptimizerState(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                        const std::vector<std::pair<std::string, at::Tensor>>& state,
                        const std::string& origin);

}  // namespace cohort::train
