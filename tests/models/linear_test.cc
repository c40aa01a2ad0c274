// Linear layers through oneDNN's sgemm (models/linear.h) against at::linear
// in float64: values and the gradients of x, W and b, on odd shapes (1,
// primes, empty), non-contiguous inputs and weights, 3-D inputs, a frozen
// weight; a row's bits whatever batch it is in; double backward; the paths
// that keep LibTorch's; the bias under bfloat16 autocast; and a GPT's
// gradients with and without oneDNN.

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "cohort/core/sgemm.h"
#include "cohort/models/gpt.h"
#include "cohort/models/linear.h"
#include "util/rounding.h"

namespace cohort::models {
namespace {

struct LinearCase {
  std::vector<int64_t> xSizes;
  int64_t out;
  bool bias;
  bool xContiguous;
  bool wContiguous;
};

at::Tensor leaf(const at::Tensor& t) { return t.detach().requires_grad_(true); }

void checkCase(const LinearCase& c) {
  const int64_t in = c.xSizes.back();
  const std::string what = "x " + c10::str(c.xSizes) + " out " + std::to_string(c.out) +
                           (c.bias ? " bias" : "") + (c.xContiguous ? "" : " x strided") +
                           (c.wContiguous ? "" : " W transposed");
  at::Tensor x64 = torch::randn(c.xSizes, torch::kDouble);
  if (!c.xContiguous) {
    std::vector<int64_t> wide = c.xSizes;
    wide.back() *= 2;
    x64 = torch::randn(wide, torch::kDouble).slice(-1, 0, wide.back(), 2);
  }
  at::Tensor w64 = c.wContiguous ? torch::randn({c.out, in}, torch::kDouble)
                                 : torch::randn({in, c.out}, torch::kDouble).t();  // a transposed view
  const at::Tensor b64 = c.bias ? torch::randn({c.out}, torch::kDouble) : at::Tensor();
  const at::Tensor gy64 = torch::randn([&] {
    std::vector<int64_t> s = c.xSizes;
    s.back() = c.out;
    return s;
  }(), torch::kDouble);

  // float32 leaves with the same values and strides.
  at::Tensor x = leaf(x64.to(torch::kFloat)), w = leaf(w64.to(torch::kFloat));
  if (!c.wContiguous) w = leaf(w64.t().contiguous().to(torch::kFloat).t());
  at::Tensor b = c.bias ? leaf(b64.to(torch::kFloat)) : at::Tensor();
  ASSERT_EQ(w.is_contiguous(), c.wContiguous);
  const int64_t before = oneDnnLinearCalls();
  const at::Tensor y = models::linear(x, w, b);
  EXPECT_EQ(oneDnnLinearCalls(), before + 1) << what << ": not through oneDNN";
  y.backward(gy64.to(torch::kFloat));
  {
    // Without gradients (decoding): no autograd node, the same product.
    torch::NoGradGuard noGrad;
    EXPECT_TRUE(torch::equal(models::linear(x, w, b), y.detach())) << what << ": without gradients";
  }

  const at::Tensor xr = leaf(x.detach().to(torch::kDouble)), wr = leaf(w.detach().to(torch::kDouble));
  const at::Tensor br = c.bias ? leaf(b.detach().to(torch::kDouble)) : at::Tensor();
  const at::Tensor yr = at::linear(xr, wr, br);
  yr.backward(gy64);
  const at::Tensor gy = gy64.to(torch::kFloat).to(torch::kDouble);
  test::expectWithinSumRounding(y, yr, at::linear(xr.detach().abs(), wr.detach().abs(), c.bias ? br.detach().abs() : br),
                       in, what + ": y");
  test::expectWithinSumRounding(x.grad(), xr.grad(), gy.abs().matmul(wr.detach().abs()), c.out, what + ": grad x");
  const int64_t rows = x.numel() / std::max<int64_t>(in, 1);
  const at::Tensor gy2 = gy.reshape({-1, c.out}).abs(), x2 = xr.detach().reshape({-1, in}).abs();
  test::expectWithinSumRounding(w.grad(), wr.grad(), gy2.t().mm(x2), rows, what + ": grad W");
  if (c.bias) test::expectWithinSumRounding(b.grad(), br.grad(), gy2.sum(0), rows, what + ": grad b");
}

TEST(Linear, AgreesWithAtenInFloat64OnOddShapesAndLayouts) {
  torch::manual_seed(3);
  const std::vector<LinearCase> cases = {
      {{1, 1}, 1, true, true, true},          {{3, 7}, 5, true, true, true},
      {{17, 128}, 130, true, true, true},     {{64, 128}, 384, false, true, true},
      {{2, 31, 13}, 29, true, true, true},    {{4, 9, 33}, 66, true, false, true},
      {{5, 64}, 17, true, true, false},       {{2, 3, 257}, 7, false, false, false},
      {{1, 768}, 3072, true, true, true},     {{8, 1, 96}, 96, true, true, true},
      // Both sides of 16 and 128 rows, where the convolutions' products run
      // transposed (models/detail/weight_product.h) and linear layers' not,
      // and of 2048, where linear layers take W transposed.
      {{15, 40}, 24, true, true, true},       {{16, 40}, 24, true, true, true},
      {{127, 9}, 33, false, true, true},      {{128, 9}, 33, true, true, true},
      {{2047, 24}, 40, true, true, true},     {{2, 1024, 24}, 40, true, true, false},
      {{2049, 7}, 3, false, false, true},
  };
  for (const LinearCase& c : cases) checkCase(c);
}

// Each row of a linear layer's output is the same bits whatever batch of 16
// to 2047 rows, or of 2048 or more, it is computed in (one process against
// data-parallel ranks, serving's batches; models/detail/weight_product.h),
// on the GPT's shapes and odd ones.
TEST(Linear, ARowComesOutAlikeInAnyBatch) {
  torch::manual_seed(12);
  torch::NoGradGuard noGrad;
  for (const auto& [in, out] : {std::pair<int64_t, int64_t>{128, 512}, {512, 128}, {128, 384}, {67, 13}}) {
    const at::Tensor x = torch::randn({4096, in});
    const at::Tensor w = torch::randn({out, in}), b = torch::randn({out});
    const at::Tensor whole = models::linear(x, w, b);
    const at::Tensor few = models::linear(x.slice(0, 0, 2047), w, b);
    for (const auto& [from, rows] : {std::pair<int64_t, int64_t>{0, 16}, {5, 32}, {100, 17}, {1000, 64}}) {
      const at::Tensor part = models::linear(x.slice(0, from, from + rows), w, b);
      EXPECT_TRUE(torch::equal(part, few.slice(0, from, from + rows)))
          << in << " -> " << out << ": rows " << from << ".." << from + rows << " differ by "
          << (part - few.slice(0, from, from + rows)).abs().max().item<double>();
    }
    for (const auto& [from, rows] : {std::pair<int64_t, int64_t>{0, 2048}, {2048, 2048}, {1000, 3000}}) {
      const at::Tensor part = models::linear(x.slice(0, from, from + rows), w, b);
      EXPECT_TRUE(torch::equal(part, whole.slice(0, from, from + rows)))
          << in << " -> " << out << ": rows " << from << ".." << from + rows << " differ by "
          << (part - whole.slice(0, from, from + rows)).abs().max().item<double>();
    }
  }
}

TEST(Linear, EmptyInputsGiveEmptyOrZeroResults) {
  const at::Tensor x = torch::zeros({0, 4}).requires_grad_(true);
  const at::Tensor w = torch::randn({3, 4}).requires_grad_(true);
  const at::Tensor b = torch::randn({3}).requires_grad_(true);
  at::Tensor y = models::linear(x, w, b);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, 3}));
  y.sum().backward();
  EXPECT_EQ(w.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(b.grad().abs().sum().item<float>(), 0.0f);
  // No input features: y is the bias, and W's gradient is empty.
  const at::Tensor x0 = torch::randn({5, 0}).requires_grad_(true);
  const at::Tensor w0 = torch::randn({3, 0}).requires_grad_(true);
  const at::Tensor b0 = torch::randn({3}).requires_grad_(true);
  const at::Tensor y0 = models::linear(x0, w0, b0);
  EXPECT_TRUE(torch::equal(y0, b0.detach().expand({5, 3})));
  y0.sum().backward();
  EXPECT_EQ(w0.grad().sizes(), w0.sizes());
  EXPECT_TRUE(torch::equal(b0.grad(), torch::full({3}, 5.0f)));
}

TEST(Linear, AFrozenWeightGetsNoGradientAndTheInputStillDoes) {
  const at::Tensor x = torch::randn({6, 10}).requires_grad_(true);
  const at::Tensor w = torch::randn({4, 10});  // frozen, as a LoRA base layer's
  models::linear(x, w).sum().backward();
  EXPECT_FALSE(w.grad().defined());
  EXPECT_TRUE(torch::allclose(x.grad(), torch::ones({6, 4}).mm(w), 1e-5, 1e-5));
}

// create_graph: the gradients are differentiable again, as at::linear's.
TEST(Linear, DoubleBackwardMatchesAten) {
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({7, 12}).requires_grad_(true);
  const at::Tensor w = torch::randn({9, 12}).requires_grad_(true);
  const at::Tensor b = torch::randn({9}).requires_grad_(true);
  auto secondOrder = [&](auto f) {
    const at::Tensor y = f(x, w, b);
    const auto g = torch::autograd::grad({y.pow(2).sum()}, {x, w}, {}, true, true);
    return torch::autograd::grad({g[0].pow(2).sum() + g[1].pow(2).sum()}, {x, w, b});
  };
  const auto got = secondOrder([](auto& a, auto& bw, auto& bb) { return models::linear(a, bw, bb); });
  const auto want = secondOrder([](auto& a, auto& bw, auto& bb) { return at::linear(a, bw, bb); });
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-3)) << "input " << i << ": largest difference "
                                                               << (got[i] - want[i]).abs().max().item<float>();
  }
}

TEST(Linear, OtherDtypesAutocastAndOneDnnOffKeepLibTorchsLinear) {
  const int64_t before = oneDnnLinearCalls();
  const at::Tensor xd = torch::randn({4, 8}, torch::kDouble), wd = torch::randn({3, 8}, torch::kDouble);
  namespace F = torch::nn::functional;
  EXPECT_TRUE(torch::equal(models::linear(xd, wd), F::linear(xd, wd)));
  const at::Tensor xb = torch::randn({4, 8}).to(torch::kBFloat16), wb = torch::randn({3, 8}).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(models::linear(xb, wb), F::linear(xb, wb)));
  const at::Tensor x = torch::randn({4, 8}), w = torch::randn({3, 8});
  {
    at::autocast::set_cpu_enabled(true);
    const at::Tensor y = models::linear(x, w);
    at::autocast::set_cpu_enabled(false);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16) << "autocast's bfloat16 product";
  }
  at::globalContext().setUserEnabledMkldnn(false);
  EXPECT_EQ(linearGemmDescription(), "aten (compute.onednn off)");
  EXPECT_TRUE(torch::equal(models::linear(x, w), F::linear(x, w)));
  at::globalContext().setUserEnabledMkldnn(true);
  EXPECT_EQ(oneDnnLinearCalls(), before) << "one of them went through oneDNN";
  EXPECT_EQ(linearGemmDescription(), "onednn");
  models::linear(x, w);
  EXPECT_EQ(oneDnnLinearCalls(), before + 1);
}

// Under CPU autocast to bfloat16 the product of a 3-D input is LibTorch's
// and the bias is cohort's kernel: the bits of LibTorch's C++ linear (its
// bfloat16 product += the float32 bias), the same input and weight
// gradients, and the bias's gradient summed in float32 (within float32
// rounding of the float64 sum, where a bfloat16 sum is 2^-9 off).
// A 2-D input keeps LibTorch's linear (addmm, the bias in the product).
TEST(Linear, UnderBf16AutocastTheBiasAddsAsAtenAndItsGradientSumsInFloat32) {
  namespace F = torch::nn::functional;
  struct Autocast {
    Autocast() {
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    }
    ~Autocast() {
      at::autocast::set_cpu_enabled(false);
      at::autocast::clear_cache();
    }
  };
  for (const std::vector<int64_t>& xs :
       std::vector<std::vector<int64_t>>{{2, 1, 24}, {1, 65, 24}, {3, 333, 24}, {2, 0, 24}, {2, 2, 3, 24}}) {
    for (int64_t out : {1, 17, 33, 384}) {
      SCOPED_TRACE(testing::Message() << "x " << c10::str(xs) << " out " << out);
      torch::manual_seed(out + xs.front());
      const at::Tensor x0 = torch::randn(xs), w0 = torch::randn({out, 24}) / 5, b0 = torch::randn({out});
      std::vector<int64_t> ys = xs;
      ys.back() = out;
      const at::Tensor gy = torch::randn(ys).to(at::kBFloat16);
      const at::Tensor x = leaf(x0), w = leaf(w0), b = leaf(b0);
      const at::Tensor xr = leaf(x0), wr = leaf(w0), br = leaf(b0);
      at::Tensor y, yr;
      {
        Autocast on;
        y = models::linear(x, w, b);
        yr = F::linear(xr, wr, br);
      }
      ASSERT_EQ(y.scalar_type(), at::kBFloat16);
      EXPECT_TRUE(torch::equal(y, yr));
      {
        Autocast on;
        torch::NoGradGuard noGrad;
        EXPECT_TRUE(torch::equal(F::linear(x0, w0) += b0, yr)) << "LibTorch's product += the bias";
        const at::Tensor x2 = x0.reshape({-1, 24});
        EXPECT_TRUE(torch::equal(models::linear(x2, w0, b0), F::linear(x2, w0, b0))) << "2-D";
      }
      y.backward(gy);
      yr.backward(gy);
      EXPECT_TRUE(torch::equal(x.grad(), xr.grad()));
      EXPECT_TRUE(torch::equal(w.grad(), wr.grad()));
      ASSERT_EQ(b.grad().scalar_type(), torch::kFloat);
      const at::Tensor exact = gy.to(torch::kDouble).reshape({-1, out}).sum(0);
      const double rows = static_cast<double>(gy.numel() / out);
      EXPECT_LE((b.grad().to(torch::kDouble) - exact).abs().max().item<double>(), 1e-6 * (1 + rows));
      // Without gradients, and with only the bias's: the same values.
      {
        Autocast on;
        torch::NoGradGuard noGrad;
        EXPECT_TRUE(torch::equal(models::linear(x0, w0, b0), yr));
      }
      const at::Tensor bOnly = leaf(b0);
      {
        Autocast on;
        const at::Tensor y1 = models::linear(x0, w0, bOnly);
        EXPECT_TRUE(torch::equal(y1, yr));
        y1.backward(gy);
      }
      EXPECT_TRUE(torch::equal(bOnly.grad(), b.grad()));
    }
  }
}

TEST(Linear, SgemmTakesEitherOperandTransposed) {
  torch::manual_seed(7);
  const at::Tensor a = torch::randn({5, 3}), b = torch::randn({3, 4});
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const at::Tensor as = ta ? a.t().contiguous() : a, bs = tb ? b.t().contiguous() : b;
      at::Tensor c = torch::full({5, 4}, 1.0f);
      cohort::oneDnnSgemm(ta, tb, 5, 4, 3, 2.0f, as.data_ptr<float>(), as.size(1), bs.data_ptr<float>(),
                          bs.size(1), 0.5f, c.data_ptr<float>(), 4);
      EXPECT_TRUE(torch::allclose(c, 2 * a.mm(b) + 0.5, 1e-5, 1e-5)) << "transA " << ta << " transB " << tb;
    }
  }
}

// A GPT's loss and every gradient with the products through oneDNN and
// through ATen (oneDNN off), to float rounding.
TEST(Linear, AGptTrainsAlikeThroughOneDnnAndAten) {
  GptOptions o;
  o.vocabSize = 64;
  o.blockSize = 16;
  o.nLayer = 2;
  o.nHead = 2;
  o.nEmbd = 32;
  o.dropout = 0;
  torch::manual_seed(11);
  auto model = createGpt(o);
  const at::Tensor idx = torch::randint(0, 64, {3, 16}, torch::kLong);
  auto lossAndGrads = [&] {
    model->zero_grad();
    const at::Tensor logits = model->forward(idx);
    const at::Tensor loss = torch::nn::functional::cross_entropy(logits.view({-1, 64}), idx.view({-1}));
    loss.backward();
    std::vector<at::Tensor> g{loss.detach()};
    for (const auto& p : model->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const int64_t before = oneDnnLinearCalls();
  const auto viaOneDnn = lossAndGrads();
  EXPECT_GE(oneDnnLinearCalls() - before, 2 * 4 + 1) << "the GPT's layers did not take oneDNN";
  at::globalContext().setUserEnabledMkldnn(false);
  const auto viaAten = lossAndGrads();
  at::globalContext().setUserEnabledMkldnn(true);
  ASSERT_EQ(viaOneDnn.size(), viaAten.size());
  for (size_t i = 0; i < viaOneDnn.size(); ++i) {
    EXPECT_TRUE(torch::allclose(viaOneDnn[i], viaAten[i], 1e-4, 1e-5))
        << "tensor " << i << ": largest difference " << (viaOneDnn[i] - viaAten[i]).abs().max().item<float>();
  }
}

}  // namespace
}  // namespace cohort::models
