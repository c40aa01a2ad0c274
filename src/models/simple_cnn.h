#pragma once

#include <torch/torch.h>

#include "cohort/models/model.h"

namespace cohort::models {

// Two 3x3 convolutions, each followed by (optional) BatchNorm, ReLU and 2x2
// max-pooling, then a hidden linear layer and the classifier. For 28x28
// inputs such as Fashion-MNIST.
class SimpleCnn : public Model {
 public:
  SimpleCnn(const ModelConfig& config, const InputShape& input);
  at::Tensor forward(const at::Tensor& x) override;

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};

}  // namespace cohort::models
