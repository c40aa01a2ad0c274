#include "cohort/models/flops.h"

#include <fmt/format.h>

#include <array>

namespace cohort::models {
namespace {

// A convolution's forward: 2 FLOPs per multiply-add, over the output's
// positions. Updates h, w to the output's size.
double convFlops(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad, int64_t& h, int64_t& w) {
  h = (h + 2 * pad - k) / stride + 1;
  w = (w + 2 * pad - k) / stride + 1;
  return 2.0 * double(in) * double(k * k) * double(out) * double(h) * double(w);
}

// torchvision's ResNet (models/resnet.cc): the stem, four groups of basic
// or bottleneck blocks (stride on the 3x3, as torchvision's v1.5), the
// 1x1 downsampling convolutions, the classifier.
double resnetFlops(int depth, const ModelConfig& c, int64_t h, int64_t w) {
  std::array<int64_t, 4> blocks{2, 2, 2, 2};
  if (depth == 34 || depth == 50) blocks = {3, 4, 6, 3};
  if (depth == 101) blocks = {3, 4, 23, 3};
  const bool bottleneck = depth >= 50;
  const int64_t expansion = bottleneck ? 4 : 1;
  double f = 0;
  if (c.smallInput) {
    f += convFlops(c.inChannels, 64, 3, 1, 1, h, w);
  } else {
    f += convFlops(c.inChannels, 64, 7, 2, 3, h, w);
    h = (h + 2 - 3) / 2 + 1;  // max pooling 3, stride 2, padding 1
    w = (w + 2 - 3) / 2 + 1;
  }
  int64_t inPlanes = 64;
  const std::array<int64_t, 4> planes{64, 128, 256, 512};
  for (size_t g = 0; g < 4; ++g) {
    for (int64_t i = 0; i < blocks[g]; ++i) {
      const int64_t stride = i == 0 && g > 0 ? 2 : 1;
      const int64_t p = planes[g];
      int64_t bh = h, bw = w;
      if (bottleneck) {
        f += convFlops(inPlanes, p, 1, 1, 0, bh, bw);
        f += convFlops(p, p, 3, stride, 1, bh, bw);
        f += convFlops(p, p * expansion, 1, 1, 0, bh, bw);
      } else {
        f += convFlops(inPlanes, p, 3, stride, 1, bh, bw);
        f += convFlops(p, p, 3, 1, 1, bh, bw);
      }
      if (stride != 1 || inPlanes != p * expansion) {
        int64_t dh = h, dw = w;
        f += convFlops(inPlanes, p * expansion, 1, stride, 0, dh, dw);
      }
      h = bh;
      w = bw;
      inPlanes = p * expansion;
    }
  }
  return f + 2.0 * double(inPlanes) * double(c.numClasses);
}

// models/simple_cnn.cc: two 3x3 convolutions each followed by 2x2 pooling,
// two linear layers.
double simpleCnnFlops(const ModelConfig& c, int64_t h, int64_t w) {
  double f = convFlops(c.inChannels, c.width, 3, 1, 1, h, w);
  h /= 2;
  w /= 2;
  f += convFlops(c.width, 2 * c.width, 3, 1, 1, h, w);
  h /= 2;
  w /= 2;
  const double flat = double(2 * c.width * h * w);
  return f + 2.0 * flat * double(c.hidden) + 2.0 * double(c.hidden) * double(c.numClasses);
}

}  // namespace

ModelFlops countModelFlops(const ModelConfig& c, int64_t height, int64_t width) {
  ModelFlops r;
  const double L = double(c.nLayer), C = double(c.nEmbd), T = double(c.blockSize), V = double(c.vocabSize);
  // Per token and layer, attention's q k^T and weighted sum over T positions.
  const double attention = 4 * T * C;
  switch (c.arch) {
    case ModelArch::gpt:
      // qkv 3 C^2, projection C^2, MLP 2 x 4 C^2 per layer; the head C V.
      r.forwardPerSample = T * (2 * (12 * L * C * C + C * V) + L * attention);
      r.formula = "gpt: 2 (12 L C^2 + C V) + 4 L T C per token";
      break;
    case ModelArch::llama: {
      const double kv = double(kvHeads(c) * (c.nEmbd / c.nHead)), I = double(intermediateWidth(c));
      // q and o C^2 each, k and v C x KV D each, SwiGLU 3 C I; the head C V.
      r.forwardPerSample = T * (2 * (L * (2 * C * C + 2 * C * kv + 3 * C * I) + C * V) + L * attention);
      r.formula = "llama: 2 (L (2 C^2 + 2 C KV D + 3 C I) + C V) + 4 L T C per token";
      break;
    }
    case ModelArch::bert: {
      const double I = double(intermediateWidth(c));
      const double blocks = T * (2 * L * (4 * C * C + 2 * C * I) + L * attention);
      if (c.task == BertTask::classify) {
        // The pooler and the classifier read the first position only.
        r.forwardPerSample = blocks + 2 * (C * C + C * double(c.numClasses));
        r.formula = "bert: 2 L (4 C^2 + 2 C I) + 4 L T C per token, 2 (C^2 + C K) per sample";
      } else {
        // The prediction head (a transform and the decoder) at every position.
        r.forwardPerSample = blocks + T * 2 * (C * C + C * V);
        r.formula = "bert: 2 (L (4 C^2 + 2 C I) + C^2 + C V) + 4 L T C per token";
      }
      break;
    }
    case ModelArch::resnet18:
    case ModelArch::resnet34:
    case ModelArch::resnet50:
    case ModelArch::resnet101: {
      const int depth = c.arch == ModelArch::resnet18   ? 18
                        : c.arch == ModelArch::resnet34 ? 34
                        : c.arch == ModelArch::resnet50 ? 50
                                                        : 101;
      r.forwardPerSample = resnetFlops(depth, c, height, width);
      r.formula = fmt::format("resnet{}: convolutions and the classifier at {}x{} px", depth, height, width);
      break;
    }
    case ModelArch::simpleCnn:
      r.forwardPerSample = simpleCnnFlops(c, height, width);
      r.formula = fmt::format("simple_cnn: convolutions and linear layers at {}x{} px", height, width);
      break;
    case ModelArch::torchscript:
      r.why = "a TorchScript model's shapes are not known from the job";
      return r;
  }
  r.known = r.forwardPerSample > 0;
  if (!r.known) r.why = "the model's shapes give no work";
  // LoRA freezes the base: its backward computes the inputs' gradients only
  // (the adapters' few weights are not counted).
  r.trainingPerSample = (c.lora.rank > 0 ? 2 : 3) * r.forwardPerSample;
  if (c.lora.rank > 0) r.formula += "; model.lora: training 2x the forward";
  return r;
}

}  // namespace cohort::models
