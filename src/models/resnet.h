#pragma once

#include <torch/torch.h>

#include "cohort/models/model.h"

namespace cohort::models {

// Folds `bn`'s eval-mode affine map into `conv`, which then computes
// bn(conv(x)) alone (its bias set from the shift).
void foldBatchNorm(torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn);

// ResNet v1.5 exactly as torchvision builds it (stride in the 3x3 convolution
// of the bottleneck), with the same module names, so state dicts are
// interchangeable. ResNet-50 with 1000 classes has 25,557,032 parameters.
class ResidualBlock : public torch::nn::Module {
 public:
  // bottleneck: 1x1 -> 3x3 -> 1x1 (expansion 4); otherwise two 3x3 (expansion 1).
  ResidualBlock(bool bottleneck, int64_t inPlanes, int64_t planes, int64_t stride,
                bool zeroInitResidual);
  at::Tensor forward(const at::Tensor& x);
  void fold();  // Model::foldForInference

 private:
  bool bottleneck_;
  bool folded_ = false;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  torch::nn::Sequential downsample_{nullptr};
};

class ResNet : public Model {
 public:
  // depth: 18, 34, 50 or 101. `part`: blocks are the layer groups
  // layer1..layer4; the stem is the input, pooling and fc the output.
  ResNet(int depth, const ModelConfig& config, const InputShape& input, const ModelPart& part = {});
  at::Tensor forward(const at::Tensor& x) override;
  void foldForInference() override;

 private:
  ModelPart part_;
  bool folded_ = false;
  bool smallInput_;
  bool recompute_;  // model.recompute: blocks, per stage (layer1..layer4)
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  // The kept layer groups, in order (all four for the whole model).
  std::vector<torch::nn::Sequential> layers_;
  torch::nn::Linear fc_{nullptr};
};

}  // namespace cohort::models
