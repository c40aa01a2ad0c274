// Convolutions as matrix products against at::conv2d in float64: values
// and the gradients of x, W and b.
// - Whose output is one pixel, as a product over their window
//   (models/window_conv.h): the windows ResNet meets (a 3x3 convolution on
//   a 1x1 map, a strided one on 2x2, a strided 1x1) and others (a whole
//   7x7 window, a rectangular kernel, channels-last tensors).
// - Whose weight outweighs their output, over the unfolded input
//   (models/gemm_conv.h): ResNet-50's last layer group at 64 px (3x3 on
//   2x2, strided 3x3 and 1x1, 1x1 on a channels-last input, which unfolds to
//   itself), padding wider than some outputs see, a rectangular kernel and
//   stride, mixed layouts of input and weight.
// The cases that keep the module's forward; a ResNet-18 at 32 px and a
// ResNet-50 at 64 px trained both ways.

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "cohort/models/model.h"
#include "models/gemm_conv.h"
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
  // The weight's layout when it differs from the input's.
  bool weightChannelsLast = channelsLast;
};

enum class Product { window, unfolded };

void checkWindowCase(const WindowCase& c, Product product = Product::window) {
  SCOPED_TRACE(c.name);
  nn::Conv2d conv(nn::Conv2dOptions(c.x[1], c.out, torch::ExpandingArray<2>(c.kernel))
                      .stride(torch::ExpandingArray<2>(c.stride))
                      .padding(torch::ExpandingArray<2>(c.padding))
                      .bias(c.bias));
  const auto format = c.channelsLast ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (c.weightChannelsLast) {
    torch::NoGradGuard noGrad;
    conv->weight.set_data(conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
  }
  const at::Tensor x = torch::randn(c.x).contiguous(format).requires_grad_(true);
  const bool window = product == Product::window;
  ASSERT_EQ(windowConvTakes(*conv, x), window);
  ASSERT_TRUE(window || gemmConvTakes(*conv, x));
  const int64_t before = window ? windowConvCalls() : gemmConvCalls();
  const at::Tensor y = conv2d(*conv, x);
  EXPECT_EQ(window ? windowConvCalls() : gemmConvCalls(), before + 1);
  const int64_t oh = (c.x[2] + 2 * c.padding[0] - c.kernel[0]) / c.stride[0] + 1;
  const int64_t ow = (c.x[3] + 2 * c.padding[1] - c.kernel[1]) / c.stride[1] + 1;
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{c.x[0], c.out, oh, ow}));
  EXPECT_TRUE(y.is_contiguous(format)) << "the output keeps the input's layout";
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
  test::expectWithinSumRounding(x.grad(), xr.grad(), gxScale, c.out * c.kernel[0] * c.kernel[1], "grad x");
  test::expectWithinSumRounding(conv->weight.grad(), wr.grad(), gwScale, c.x[0] * oh * ow, "grad W");
  EXPECT_EQ(conv->weight.grad().strides(), conv->weight.strides()) << "the weight gradient keeps the weight's layout";
  if (c.bias) {
    test::expectWithinSumRounding(conv->bias.grad(), br.grad(), g64.abs().sum({0, 2, 3}), c.x[0] * oh * ow, "grad b");
  }
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

TEST(GemmConv, AgreesWithConv2dInFloat64) {
  torch::manual_seed(3);
  const std::vector<WindowCase> cases = {
      {"3x3 on 2x2, channels-last", {8, 64, 2, 2}, 64, {3, 3}, {1, 1}, {1, 1}, false, true},
      {"3x3 stride 2 on 4x4", {4, 16, 4, 4}, 32, {3, 3}, {2, 2}, {1, 1}, true},
      {"1x1 on 2x2, channels-last (the input unfolded)", {8, 48, 2, 2}, 64, {1, 1}, {1, 1}, {0, 0}, true, true},
      {"1x1 on 2x2, contiguous", {3, 20, 2, 2}, 16, {1, 1}, {1, 1}, {0, 0}},
      {"1x1 stride 2 on 4x4, channels-last", {4, 24, 4, 4}, 40, {1, 1}, {2, 2}, {0, 0}, false, true},
      {"5x5 padding 2 on 3x3: taps that see no input", {2, 6, 3, 3}, 40, {5, 5}, {1, 1}, {2, 2}, true},
      {"3x2 stride (2, 1) on 5x3", {1, 9, 5, 3}, 12, {3, 2}, {2, 1}, {1, 0}},
      {"channels-last input, contiguous weight", {2, 10, 3, 3}, 40, {3, 3}, {1, 1}, {1, 1}, false, true, false},
      {"contiguous input, channels-last weight", {2, 10, 3, 3}, 40, {3, 3}, {1, 1}, {1, 1}, true, false, true},
  };
  for (const WindowCase& c : cases) checkWindowCase(c, Product::unfolded);
}

TEST(GemmConv, OutputsLargerThanTheWeightKeepTheModulesForward) {
  nn::Conv2d conv(nn::Conv2dOptions(8, 16, 3).padding(1).bias(false));
  EXPECT_TRUE(gemmConvTakes(*conv, torch::randn({4, 8, 2, 2}))) << "16 channels, 16 output pixels";
  EXPECT_FALSE(gemmConvTakes(*conv, torch::randn({5, 8, 2, 2}))) << "16 channels, 20 output pixels";
  // Several taps on rows wider than 2 pixels: more than twice the pixels.
  nn::Conv2d wide(nn::Conv2dOptions(8, 33, 3).padding(1).bias(false));
  EXPECT_TRUE(gemmConvTakes(*wide, torch::randn({1, 8, 4, 4}))) << "33 channels, 16 output pixels";
  nn::Conv2d twice(nn::Conv2dOptions(8, 32, 3).padding(1).bias(false));
  EXPECT_FALSE(gemmConvTakes(*twice, torch::randn({1, 8, 4, 4}))) << "32 channels, 16 output pixels";
  EXPECT_TRUE(gemmConvTakes(*twice, torch::randn({4, 8, 4, 2}))) << "rows of 2 pixels";
  nn::Conv2d pointwise(nn::Conv2dOptions(8, 16, 1).bias(false));
  EXPECT_TRUE(gemmConvTakes(*pointwise, torch::randn({1, 8, 4, 4}))) << "one tap: 16 channels, 16 pixels";
  EXPECT_FALSE(gemmConvTakes(*conv, torch::randn({4, 8, 2, 2}, torch::kDouble))) << "float64";
  nn::Conv2d grouped(nn::Conv2dOptions(8, 16, 3).padding(1).groups(2));
  EXPECT_FALSE(gemmConvTakes(*grouped, torch::randn({1, 8, 2, 2})));
  nn::Conv2d dilated(nn::Conv2dOptions(8, 16, 3).padding(2).dilation(2));
  EXPECT_FALSE(gemmConvTakes(*dilated, torch::randn({1, 8, 2, 2})));
  nn::Conv2d same(nn::Conv2dOptions(8, 16, 3).padding(torch::kSame));
  EXPECT_FALSE(gemmConvTakes(*same, torch::randn({1, 8, 2, 2}))) << "padding given as 'same'";
  nn::Conv2d reflect(nn::Conv2dOptions(8, 16, 1).padding_mode(torch::kReflect));
  EXPECT_FALSE(gemmConvTakes(*reflect, torch::randn({1, 8, 2, 2})));
  {
    torch::NoGradGuard noGrad;
    nn::Conv2d strided(nn::Conv2dOptions(8, 16, 3).padding(1).bias(false));
    strided->weight.set_data(strided->weight.transpose(2, 3).contiguous().transpose(2, 3));
    EXPECT_FALSE(gemmConvTakes(*strided, torch::randn({1, 8, 2, 2}))) << "a weight dense in neither layout";
  }
  EXPECT_FALSE(gemmConvTakes(*conv, torch::randn({1, 8, 2, 2}, torch::kDouble)));
  at::globalContext().setUserEnabledMkldnn(false);
  EXPECT_FALSE(gemmConvTakes(*conv, torch::randn({1, 8, 2, 2}))) << "oneDNN off";
  at::globalContext().setUserEnabledMkldnn(true);
  const at::Tensor x = torch::randn({5, 8, 2, 2});
  const int64_t before = gemmConvCalls();
  EXPECT_TRUE(torch::equal(conv2d(*conv, x), conv->forward(x))) << "the module's own forward, bitwise";
  EXPECT_EQ(gemmConvCalls(), before);
}

// The choices training measures at start (train/conv_products.cc) are per
// shape: a shape set to the convolution keeps the module's forward, a shape
// not measured follows the rule; recording a pass lists each shape the
// rule takes once, in order of first use; timing one gives both times.
TEST(GemmConv, ChoicesPerShapeOverrideTheRuleAndAPassListsItsShapes) {
  nn::Conv2d a(nn::Conv2dOptions(8, 16, 3).padding(1).bias(false));
  nn::Conv2d b(nn::Conv2dOptions(8, 16, 1));
  const at::Tensor x = torch::randn({4, 8, 2, 2});
  const auto candidates = recordUnfoldedCandidates([&] {
    conv2d(*a, x);
    conv2d(*b, x.contiguous(at::MemoryFormat::ChannelsLast));
    conv2d(*a, x);
    conv2d(*a, torch::randn({5, 8, 2, 2}));  // 20 output pixels: not taken
  });
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[0].description, "[4,8,2,2] 3x3 s1 -> 16");
  EXPECT_EQ(candidates[1].description, "[4,8,2,2] nhwc 1x1 s1 -> 16");
  EXPECT_TRUE(recordUnfoldedCandidates([] {}).empty());
  setUnfoldedChoices({{candidates[0].key, false}});
  EXPECT_FALSE(gemmConvTakes(*a, x));
  EXPECT_TRUE(gemmConvTakes(*b, x.contiguous(at::MemoryFormat::ChannelsLast)));
  EXPECT_TRUE(gemmConvTakes(*b, x)) << "another layout, not measured: the rule";
  const int64_t before = gemmConvCalls();
  EXPECT_TRUE(torch::equal(conv2d(*a, x), a->forward(x))) << "the module's own forward, bitwise";
  EXPECT_EQ(gemmConvCalls(), before);
  setUnfoldedChoices({});
  EXPECT_TRUE(gemmConvTakes(*a, x));
  const std::array<double, 2> t = timeUnfoldedCandidate(candidates[1], 1);
  EXPECT_GT(t[0], 0);
  EXPECT_GT(t[1], 0);
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

// One training step's loss and every gradient with the products and with
// oneDNN off (the module's forward: neither product), to rounding. Without
// batchStatistics BatchNorm takes its running ones (eval mode).
void checkTrainsAlike(ModelArch arch, int64_t pixels, int64_t batch, int64_t windows, int64_t unfolded,
                      bool batchStatistics = true) {
  ModelConfig c;
  c.arch = arch;
  c.inChannels = 3;
  c.numClasses = 10;
  torch::manual_seed(4);
  const auto model = createModel(c, {3, pixels, pixels});
  model->train(batchStatistics);
  const at::Tensor images = torch::randn({batch, 3, pixels, pixels});
  const at::Tensor labels = torch::randint(0, 10, {batch}, torch::kLong);
  auto step = [&] {
    model->zero_grad();
    const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
    loss.backward();
    std::vector<at::Tensor> out{loss.detach()};
    for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const int64_t windowsBefore = windowConvCalls(), unfoldedBefore = gemmConvCalls();
  // The first step's batch statistics move the running ones; both steps
  // see the same weights and inputs, and batch statistics in training.
  const auto products = step();
  EXPECT_EQ(windowConvCalls() - windowsBefore, windows);
  EXPECT_EQ(gemmConvCalls() - unfoldedBefore, unfolded);
  at::globalContext().setUserEnabledMkldnn(false);
  const auto plain = step();
  at::globalContext().setUserEnabledMkldnn(true);
  ASSERT_EQ(products.size(), plain.size());
  // Relative to each tensor's norm: BatchNorm over few values a channel in
  // the last layers magnifies rounding, elementwise most where a gradient
  // is small.
  for (size_t i = 0; i < products.size(); ++i) {
    const double rel = ((products[i] - plain[i]).norm() / plain[i].norm().clamp_min(1e-12)).item<double>();
    EXPECT_LT(rel, 1e-4) << "tensor " << i << ": largest difference "
                         << (products[i] - plain[i]).abs().max().item<float>();
  }
}

// ResNet-18 at 32 px, batch 4 (the ImageNet stem: layer4 sees 1x1 maps):
// layer4's five convolutions as window products; layer3's five (256
// channels, 16 output pixels) and layer2's 1x1 downsample (128, 64)
// unfolded, not layer2's 3x3 ones (64 pixels on rows of 4).
TEST(WindowConv, AResNetAt32PixelsTakesItAndTrainsAlike) {
  checkTrainsAlike(ModelArch::resnet18, 32, 4, 5, 6);
}

// ResNet-50 at 64 px, batch 2: output pixels 512, 128, 32 and 8 in the four
// layer groups. Unfolded: layer2's 1x1 convolutions but its first (on
// 16x16, 512 pixels for 128 channels), not its 3x3 ones (128 channels on
// 128 pixels, rows of 8), 8; every one of layer3 (19) and layer4 (10).
// With BatchNorm's running statistics: at initialization, batch statistics
// over so few values a channel make this step's gradients ill-conditioned;
// oneDNN's convolutions and these products alike then differ from float64
// by 2% (measured), so comparing the two would test only that.
TEST(GemmConv, AResNet50At64PixelsTakesItAndTrainsAlike) {
  checkTrainsAlike(ModelArch::resnet50, 64, 2, 0, 37, /*batchStatistics=*/false);
}

}  // namespace
}  // namespace cohort::models
