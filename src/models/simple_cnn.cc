#include "models/simple_cnn.h"

#include <fmt/format.h>

#include "cohort/core/error.h"
#include "cohort/models/fused_ops.h"

namespace cohort::models {

SimpleCnn::SimpleCnn(const ModelConfig& c, const InputShape& in) {
  if (in.height < 4 || in.width < 4) {
    throw ConfigError(fmt::format("model.arch: simple_cnn needs inputs of at least 4x4, got {}x{}",
                                  in.height, in.width));
  }
  namespace nn = torch::nn;
  const int64_t w = c.width;
  conv1_ = register_module(
      "conv1", nn::Conv2d(nn::Conv2dOptions(in.channels, w, 3).padding(1).bias(!c.batchNorm)));
  if (c.batchNorm) bn1_ = register_module("bn1", nn::BatchNorm2d(w));
  conv2_ = register_module(
      "conv2", nn::Conv2d(nn::Conv2dOptions(w, 2 * w, 3).padding(1).bias(!c.batchNorm)));
  if (c.batchNorm) bn2_ = register_module("bn2", nn::BatchNorm2d(2 * w));
  const int64_t flat = 2 * w * (in.height / 2 / 2) * (in.width / 2 / 2);
  fc1_ = register_module("fc1", nn::Linear(flat, c.hidden));
  dropout_ = register_module("dropout", nn::Dropout(c.dropout));
  fc2_ = register_module("fc2", nn::Linear(c.hidden, c.numClasses));
}

at::Tensor SimpleCnn::forward(const at::Tensor& input) {
  // relu(bn(conv(x))) as one op in training where fused ops are on
  // (cohort/models/fused_ops.h); bn's own forward, then relu, otherwise.
  at::Tensor x = conv1_(inLayout(input));
  x = torch::max_pool2d(bn1_ ? batchNormRelu(*bn1_, x) : torch::relu(x), 2);
  x = conv2_(x);
  x = torch::max_pool2d(bn2_ ? batchNormRelu(*bn2_, x) : torch::relu(x), 2);
  x = torch::relu(fc1_(x.flatten(1)));
  return fc2_(dropout_(x));
}

}  // namespace cohort::models
