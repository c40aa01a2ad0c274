#include "models/resnet.h"

#include <fmt/format.h>

#include <array>

#include "cohort/core/error.h"
#include "models/fused_ops.h"
#include "models/recompute.h"
#include "models/window_conv.h"

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

void foldBatchNorm(nn::Conv2d& conv, const nn::BatchNorm2d& bn) {
  torch::NoGradGuard noGrad;
  // bn(y) = (y - mean) * gamma / sqrt(var + eps) + beta, per output channel.
  const at::Tensor scale = bn->running_var.add(bn->options.eps()).rsqrt().mul(bn->weight);
  at::Tensor shift = bn->bias.sub(bn->running_mean.mul(scale));
  if (conv->bias.defined()) shift.add_(conv->bias.mul(scale));
  conv->weight.mul_(scale.view({-1, 1, 1, 1}));  // in place: the weight keeps its layout
  conv->bias = shift;
}

void ResidualBlock::fold() {
  foldBatchNorm(conv1_, bn1_);
  foldBatchNorm(conv2_, bn2_);
  if (bottleneck_) foldBatchNorm(conv3_, bn3_);
  if (downsample_) {
    nn::Conv2d conv(std::dynamic_pointer_cast<nn::Conv2dImpl>(downsample_->ptr(0)));
    foldBatchNorm(conv, nn::BatchNorm2d(std::dynamic_pointer_cast<nn::BatchNorm2dImpl>(downsample_->ptr(1))));
  }
  folded_ = true;
}

at::Tensor ResidualBlock::forward(const at::Tensor& x) {
  if (folded_) {
    // Inference: the normalizations are in the convolutions; nothing keeps
    // an activation for backward, so the ReLUs work in place.
    at::Tensor out = conv2d(*conv2_, conv2d(*conv1_, x).relu_());
    if (bottleneck_) out = conv2d(*conv3_, out.relu_());
    return out.add_(downsample_ ? conv2d(*downsample_[0]->as<nn::Conv2d>(), x) : x).relu_();
  }
  // relu(bn(.)) in one op (models/fused_ops.h): fused in training when
  // fused ops are on. conv2d (models/window_conv.h): a convolution whose
  // output is one pixel as a product over the taps that meet the input.
  at::Tensor out = batchNormRelu(*bn1_, conv2d(*conv1_, x));
  out = bottleneck_ ? bn3_(conv2d(*conv3_, batchNormRelu(*bn2_, conv2d(*conv2_, out))))
                    : bn2_(conv2d(*conv2_, out));
  at::Tensor identity =
      downsample_ ? downsample_[1]->as<nn::BatchNorm2d>()->forward(conv2d(*downsample_[0]->as<nn::Conv2d>(), x))
                  : x;
  return torch::relu(out + identity);
}

ResNet::ResNet(int depth, const ModelConfig& c, const InputShape& in, const ModelPart& part)
    : part_(part), smallInput_(c.smallInput), recompute_(c.recompute == Recompute::blocks) {
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
  const int64_t end = part.endBlock < 0 ? 4 : part.endBlock;
  if (part.firstBlock < 0 || part.firstBlock >= end || end > 4) {
    throw ConfigError(fmt::format("model.arch: layer groups [{}, {}) are not a part of resnet{} (4 "
                                  "groups)",
                                  part.firstBlock, end, depth));
  }
  // Every unit is built in torchvision's order, whether this part keeps it
  // or not (exact parts), so that the random numbers Conv2d's and Linear's
  // default initialization draw are drawn alike; the shapes of the
  // convolution weights of the whole model are kept, in modules() order,
  // for the initialization below.
  const bool exact = part.exact;
  std::vector<std::vector<int64_t>> convShapes;
  std::vector<at::Tensor> keptConvs;  // per entry of convShapes: the weight, or undefined
  auto note = [&](nn::Module& unit, bool keep) {
    for (auto& m : unit.modules(/*include_self=*/true)) {
      if (auto* cv = m->as<nn::Conv2d>()) {
        convShapes.push_back(cv->weight.sizes().vec());
        keptConvs.push_back(keep ? cv->weight : at::Tensor());
      }
    }
  };
  const int64_t inPlanesStem = 64;
  if (part.input || exact) {
    nn::Conv2d stem = smallInput_
                          ? conv(in.channels, inPlanesStem, 3, 1)
                          : nn::Conv2d(nn::Conv2dOptions(in.channels, inPlanesStem, 7).stride(2).padding(3).bias(false));
    nn::BatchNorm2d bn(inPlanesStem);
    note(*stem, part.input);
    if (part.input) {
      conv1_ = register_module("conv1", stem);
      bn1_ = register_module("bn1", bn);
    }
  }

  const int64_t expansion = bottleneck ? 4 : 1;
  int64_t inPlanes = inPlanesStem;
  auto makeLayer = [&](int64_t planes, int64_t count, int64_t stride) {
    nn::Sequential layer;
    for (int64_t i = 0; i < count; ++i) {
      layer->push_back(std::make_shared<ResidualBlock>(bottleneck, inPlanes, planes,
                                                       i == 0 ? stride : 1, c.zeroInitResidual));
      inPlanes = planes * expansion;
    }
    return layer;
  };
  const std::array<int64_t, 4> planes{64, 128, 256, 512};
  for (int64_t g = 0; g < 4; ++g) {
    const bool keep = part.holds(g, 4);
    if (!keep && !exact) {
      inPlanes = planes[static_cast<size_t>(g)] * expansion;
      continue;
    }
    nn::Sequential layer = makeLayer(planes[static_cast<size_t>(g)], blocks[static_cast<size_t>(g)],
                                     g == 0 ? 1 : 2);
    note(*layer, keep);
    if (keep) layers_.push_back(register_module(fmt::format("layer{}", g + 1), layer));
  }
  if (part.output || exact) {
    nn::Linear fc(512 * expansion, c.numClasses);
    if (part.output) fc_ = register_module("fc", fc);
  }

  // torchvision's initialization: He-normal (fan_out) convolutions, BatchNorm
  // at identity; the classifier keeps Linear's default. A convolution this
  // part does not keep draws into a scratch tensor of its shape.
  torch::NoGradGuard g;
  for (size_t k = 0; k < convShapes.size(); ++k) {
    at::Tensor w = keptConvs[k].defined() ? keptConvs[k] : at::empty(convShapes[k]);
    nn::init::kaiming_normal_(w, 0.0, torch::kFanOut, torch::kReLU);
  }
}

void ResNet::foldForInference() {
  if (folded_) return;
  if (part_.input) foldBatchNorm(conv1_, bn1_);
  for (nn::Sequential& stage : layers_) {
    for (size_t k = 0; k < stage->size(); ++k) stage->ptr<ResidualBlock>(k)->fold();
  }
  folded_ = true;
}

at::Tensor ResNet::forward(const at::Tensor& input) {
  at::Tensor x = inLayout(input);
  if (part_.input) {
    x = folded_ ? conv1_(x).relu_() : batchNormRelu(*bn1_, conv1_(x));
    if (!smallInput_) x = torch::max_pool2d(x, 3, 2, 1);
  } else if (x.dim() != 4) {
    throw DataError(fmt::format("resnet: a stage from layer group {} expects activations [batch, "
                                "channels, height, width], got {} dimension(s)",
                                part_.firstBlock + 1, x.dim()));
  }
  for (nn::Sequential& stage : layers_) {
    x = recompute_ && is_training()
            ? recomputed([s = stage](const at::Tensor& in) mutable { return s->forward(in); }, x,
                         stage->buffers())
            : stage->forward(x);
  }
  if (!part_.output) return x;
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc_(x);
}

}  // namespace cohort::models
