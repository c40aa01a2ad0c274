#include "cohort/train/optimizer.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "cohort/core/error.h"

namespace cohort::train {

std::unique_ptr<torch::optim::Optimizer> createOptimizer(const OptimizerConfig& c,
                                                         std::vector<at::Tensor> parameters) {
  if (c.name == "sgd") {
    torch::optim::SGDOptions o(c.lr);
    o.momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weightDecay);
    return std::make_unique<torch::optim::SGD>(std::move(parameters), o);
  }
  if (c.name == "adamw") {
    torch::optim::AdamWOptions o(c.lr);
    o.betas({c.betas.at(0), c.betas.at(1)}).eps(c.eps).weight_decay(c.weightDecay);
    return std::make_unique<torch::optim::AdamW>(std::move(parameters), o);
  }
  throw ConfigError("training.optimizer.name: unknown optimizer '" + c.name + "'");
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace cohort::train
