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
