#include "models/resnet.h"

#include <fmt/format.h>

#include "cohort/core/error.h"
#include "models/recompute.h"

namespace cohort::models {
namespace nn = torch::nn;
namespace {

nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false));
}

}  // namespace

ResidualBlock::ResidualBlock(bool bottleneck, int64_t inPlanes, int64_t planes, int64_t stride,
                             bool zeroInitResidual)
    : bottleneck_(bottleneck) {
  const int64_t expansion = bottleneck ? 4 : 1;
  if (bottleneck) {
    conv1_ = register_module("conv1", conv(inPlanes, planes, 1, 1));
    bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, stride));
    bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
    conv3_ = register_module("conv3", conv(planes, planes * expansion, 1, 1));
    bn3_ = register_module("bn3", nn::BatchNorm2d(planes * expansion));
  } else {
    conv1_ = register_module("conv1", conv(inPlanes, planes, 3, stride));
    bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, 1));
    bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
  }
  if (stride != 1 || inPlanes != planes * expansion) {
    downsample_ = register_module(
        "downsample",
        nn::Sequential(conv(inPlanes, planes * expansion, 1, stride),
                       nn::BatchNorm2d(planes * expansion)));
  }
  if (zeroInitResidual) {
    torch::NoGradGuard g;
    (bottleneck ? bn3_ : bn2_)->weight.zero_();
  }
}

at::Tensor ResidualBlock::forward(const at::Tensor& x) {
  at::Tensor out = torch::relu(bn1_(conv1_(x)));
  out = bn2_(conv2_(out));
  if (bottleneck_) out = bn3_(conv3_(torch::relu(out)));
  at::Tensor identity = downsample_ ? downsample_->forward(x) : x;
  return torch::relu(out + identity);
}

ResNet::ResNet(int depth, const ModelConfig& c, const InputShape& in) : smallInput_(c.smallInput), recompute_(c.recompute == Recompute::blocks) {
  std::vector<int64_t> blocks;
  bool bottleneck = depth >= 50;
  switch (depth) {
    case 18: blocks = {2, 2, 2, 2}; break;
    case 34: blocks = {3, 4, 6, 3}; break;
    case 50: blocks = {3, 4, 6, 3}; break;
    case 101: blocks = {3, 4, 23, 3}; break;
    default: throw ConfigError(fmt::format("model.arch: no ResNet of depth {}", depth));
  }
  const int64_t minSize = smallInput_ ? 8 : 32;
  if (in.height < minSize || in.width < minSize) {
    throw ConfigError(fmt::format(
        "model.arch: resnet{} needs inputs of at least {}x{} px, got {}x{}{}", depth, minSize,
        minSize, in.height, in.width, smallInput_ ? "" : " (model.small_input: true suits 28-64 px)"));
  }
  if (smallInput_) {
    conv1_ = register_module("conv1", conv(in.channels, 64, 3, 1));
  } else {
    conv1_ = register_module(
        "conv1", nn::Conv2d(nn::Conv2dOptions(in.channels, 64, 7).stride(2).padding(3).bias(false)));
  }
  bn1_ = register_module("bn1", nn::BatchNorm2d(64));

  const int64_t expansion = bottleneck ? 4 : 1;
  int64_t inPlanes = 64;
  auto makeLayer = [&](int64_t planes, int64_t count, int64_t stride) {
    nn::Sequential layer;
    for (int64_t i = 0; i < count; ++i) {
      layer->push_back(std::make_shared<ResidualBlock>(bottleneck, inPlanes, planes,
                                                       i == 0 ? stride : 1, c.zeroInitResidual));
      inPlanes = planes * expansion;
    }
    return layer;
  };
  layer1_ = register_module("layer1", makeLayer(64, blocks[0], 1));
  layer2_ = register_module("layer2", makeLayer(128, blocks[1], 2));
  layer3_ = register_module("layer3", makeLayer(256, blocks[2], 2));
  layer4_ = register_module("layer4", makeLayer(512, blocks[3], 2));
  fc_ = register_module("fc", nn::Linear(512 * expansion, c.numClasses));

  // torchvision's initialization: He-normal (fan_out) convolutions, BatchNorm
  // at identity; the classifier keeps Linear's default.
  torch::NoGradGuard g;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* cv = m->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(cv->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
}

at::Tensor ResNet::forward(const at::Tensor& input) {
  at::Tensor x = torch::relu(bn1_(conv1_(inLayout(input))));
  if (!smallInput_) x = torch::max_pool2d(x, 3, 2, 1);
  for (nn::Sequential* stage : {&layer1_, &layer2_, &layer3_, &layer4_}) {
    x = recompute_ && is_training()
            ? recomputed([s = *stage](const at::Tensor& in) mutable { return s->forward(in); }, x,
                         (*stage)->buffers())
            : (*stage)->forward(x);
  }
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc_(x);
}

}  // namespace cohort::models
