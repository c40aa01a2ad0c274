// Convolutions whose output is one pixel as a product over their window
// (models/window_conv.h) against at::conv2d in float64: values and the
// gradients of x, W and b, for the windows ResNet meets (a 3x3 convolution
// on a 1x1 map, a strided one on 2x2, a strided 1x1) and others (a whole
// 7x7 window, a rectangular kernel, channels-last tensors); the cases that
// keep the module's forward; and a ResNet-18 at 32 px trained both ways.

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "cohort/models/model.h"
#include "models/window_conv.h"
#include "util/rounding.h"

namespace cohort::models {
namespace {

namespace nn = torch::nn;
struct WindowCase {
  std::string name;
  std::vector<int64_t> x;  // N, C, H, W
  int64_t out;
  std::vector<int64_t> kernel, stride, padding;
  bool bias = false;
  bool channelsLast = false;
};

void checkWindowCase(const WindowCase& c) {
  SCOPED_TRACE(c.name);
  nn::Conv2d conv(nn::Conv2dOptions(c.x[1], c.out, torch::ExpandingArray<2>(c.kernel))
                      .stride(torch::ExpandingArray<2>(c.stride))
                      .padding(torch::ExpandingArray<2>(c.padding))
                      .bias(c.bias));
  const auto format = c.channelsLast ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (c.channelsLast) {
    torch::NoGradGuard noGrad;
    conv->weight.set_data(conv->weight.contiguous(format));
  }
  const at::Tensor x = torch::randn(c.x).contiguous(format).requires_grad_(true);
  ASSERT_TRUE(windowConvTakes(*conv, x));
  const int64_t before = windowConvCalls();
  const at::Tensor y = conv2d(*conv, x);
  EXPECT_EQ(windowConvCalls(), before + 1);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{c.x[0], c.out, 1, 1}));
  const at::Tensor gy = torch::randn(y.sizes());
  y.backward(gy);

  auto leaf64 = [](const at::Tensor& t) { return t.detach().to(torch::kDouble).requires_grad_(true); };
  const at::Tensor xr = leaf64(x), wr = leaf64(conv->weight);
  const at::Tensor br = c.bias ? leaf64(conv->bias) : at::Tensor();
  const at::Tensor yr = at::conv2d(xr, wr, br, c.stride, c.padding);
  const at::Tensor g64 = gy.to(torch::kDouble);
  yr.backward(g64);
  const int64_t taps = c.x[1] * c.kernel[0] * c.kernel[1];
  test::expectWithinSumRounding(y, yr, at::conv2d(xr.detach().abs(), wr.detach().abs(), c.bias ? br.detach().abs() : br,
                                         c.stride, c.padding),
                       taps, "y");
  // Gradients: bounded by the products of magnitudes they sum, which are
  // the gradients of sum(|gy| conv(.)) with |x| and |W| in it.
  const at::Tensor xl = torch::zeros_like(xr).requires_grad_(true), wl = torch::zeros_like(wr).requires_grad_(true);
  const at::Tensor gxScale = torch::autograd::grad(
      {(at::conv2d(xl, wr.detach().abs(), {}, c.stride, c.padding) * g64.abs()).sum()}, {xl})[0];
  const at::Tensor gwScale = torch::autograd::grad(
      {(at::conv2d(xr.detach().abs(), wl, {}, c.stride, c.padding) * g64.abs()).sum()}, {wl})[0];
  test::expectWithinSumRounding(x.grad(), xr.grad(), gxScale, c.out, "grad x");
  test::expectWithinSumRounding(conv->weight.grad(), wr.grad(), gwScale, c.x[0], "grad W");
  if (c.bias) test::expectWithinSumRounding(conv->bias.grad(), br.grad(), g64.abs().sum({0, 2, 3}), c.x[0], "grad b");
}

TEST(WindowConv, AgreesWithConv2dInFloat64) {
  torch::manual_seed(2);
  const std::vector<WindowCase> cases = {
      {"3x3 on a 1x1 map", {8, 64, 1, 1}, 32, {3, 3}, {1, 1}, {1, 1}},
      {"3x3 stride 2 on 2x2", {5, 16, 2, 2}, 24, {3, 3}, {2, 2}, {1, 1}, true},
      {"1x1 stride 2 on 2x2", {4, 32, 2, 2}, 16, {1, 1}, {2, 2}, {0, 0}},
      {"7x7 on 7x7, no padding", {3, 5, 7, 7}, 6, {7, 7}, {1, 1}, {0, 0}, true},
      {"5x3 on 1x3", {2, 7, 1, 3}, 11, {5, 3}, {1, 1}, {2, 0}},
      {"3x3 on 1x1, channels-last", {6, 40, 1, 1}, 20, {3, 3}, {1, 1}, {1, 1}, true, true},
      {"3x3 stride 2 on 2x2, channels-last", {3, 24, 2, 2}, 8, {3, 3}, {2, 2}, {1, 1}, false, true},
      {"one image", {1, 3, 1, 1}, 1, {3, 3}, {1, 1}, {1, 1}},
  };
  for (const WindowCase& c : cases) checkWindowCase(c);
}

TEST(WindowConv, LargerOutputsAndOtherConvolutionsKeepTheModulesForward) {
  nn::Conv2d conv(nn::Conv2dOptions(8, 4, 3).padding(1).bias(false));
  EXPECT_FALSE(windowConvTakes(*conv, torch::randn({2, 8, 2, 2}))) << "a 2x2 output";
  EXPECT_TRUE(windowConvTakes(*conv, torch::randn({2, 8, 1, 1})));
  EXPECT_FALSE(windowConvTakes(*conv, torch::randn({2, 8, 1, 1}, torch::kDouble))) << "float64";
  nn::Conv2d grouped(nn::Conv2dOptions(8, 4, 3).padding(1).groups(2));
  EXPECT_FALSE(windowConvTakes(*grouped, torch::randn({2, 8, 1, 1})));
  nn::Conv2d dilated(nn::Conv2dOptions(8, 4, 3).padding(2).dilation(2));
  EXPECT_FALSE(windowConvTakes(*dilated, torch::randn({2, 8, 1, 1})));
  nn::Conv2d same(nn::Conv2dOptions(8, 4, 3).padding(torch::kSame));
  EXPECT_FALSE(windowConvTakes(*same, torch::randn({2, 8, 1, 1}))) << "padding given as 'same'";
  nn::Conv2d reflect(nn::Conv2dOptions(8, 4, 1).padding_mode(torch::kReflect));
  EXPECT_FALSE(windowConvTakes(*reflect, torch::randn({2, 8, 1, 1})));
  at::globalContext().setUserEnabledMkldnn(false);
  EXPECT_FALSE(windowConvTakes(*conv, torch::randn({2, 8, 1, 1}))) << "oneDNN off";
  at::globalContext().setUserEnabledMkldnn(true);
  // What it keeps is the module's own forward, bitwise.
  const at::Tensor x = torch::randn({2, 8, 2, 2});
  EXPECT_TRUE(torch::equal(conv2d(*conv, x), conv->forward(x)));
}

// ResNet-18 at 32 px (the ImageNet stem: its last layer group sees 1x1
// maps): one training step's loss and every gradient with the window
// products and with oneDNN off (the module's forward), to rounding.
TEST(WindowConv, AResNetAt32PixelsTakesItAndTrainsAlike) {
  ModelConfig c;
  c.arch = ModelArch::resnet18;
  c.inChannels = 3;
  c.numClasses = 10;
  torch::manual_seed(4);
  const auto model = createModel(c, {3, 32, 32});
  model->train();
  const at::Tensor images = torch::randn({4, 3, 32, 32});
  const at::Tensor labels = torch::randint(0, 10, {4}, torch::kLong);
  auto step = [&] {
    model->zero_grad();
    const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
    loss.backward();
    std::vector<at::Tensor> out{loss.detach()};
    for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const int64_t before = windowConvCalls();
  // The first step's batch statistics move the running ones; both steps
  // see the same weights and inputs, and batch statistics in training.
  const auto windowed = step();
  EXPECT_EQ(windowConvCalls() - before, 5) << "layer4's five convolutions";
  at::globalContext().setUserEnabledMkldnn(false);
  const auto plain = step();
  at::globalContext().setUserEnabledMkldnn(true);
  ASSERT_EQ(windowed.size(), plain.size());
  // Relative to each tensor's norm: BatchNorm over 4 values a channel in
  // layer4 magnifies rounding, elementwise most where a gradient is small.
  for (size_t i = 0; i < windowed.size(); ++i) {
    const double rel = ((windowed[i] - plain[i]).norm() / plain[i].norm().clamp_min(1e-12)).item<double>();
    EXPECT_LT(rel, 1e-4) << "tensor " << i << ": largest difference "
                         << (windowed[i] - plain[i]).abs().max().item<float>();
  }}

}  // namespace
}  // namespace cohort::models
