// The fused training ops (models/fused_ops.h) against the ATen ops they
// replace: values in float32 (to the tolerances below) and float64,
// gradients of every input in float64, BatchNorm's running statistics; odd
// sizes (1, primes, widths not a multiple of the vector width),
// non-contiguous and channels-last inputs; the fallbacks; and the models
// that use them.

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "cohort/models/gpt.h"
#include "cohort/models/model.h"
#include "models/fused_kernels.h"
#include "models/fused_ops.h"
#include "util/autograd_graph.h"
#include "util/gpt.h"

namespace cohort::models {
namespace {

// Each fused op runs in the inputs' dtype; the ATen ops it replaces run on
// the same values in float64, the reference. Tolerances, elementwise:
// |fused - reference| <= tol * (1 + |reference|). float32: 1e-5 (the
// float32 ATen ops are within ~1e-6 of the reference, but LayerNorm of
// width 1 is not: 1e-4 off, its mean not quite the value); BatchNorm,
// whose statistics sum 10^4 values per channel: 1e-4. float64: 1e-10.
constexpr double kFloatTol = 1e-5;
constexpr double kBnFloatTol = 1e-4;
constexpr double kWidthOneFloatTol = 1e-4;
constexpr double kDoubleTol = 1e-10;

void expectClose(const at::Tensor& got, const at::Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_TRUE(want.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.detach().to(torch::kDouble), w = want.detach().to(torch::kDouble);
  const at::Tensor excess = (g - w).abs() - tol * (1 + w.abs());
  EXPECT_TRUE(excess.numel() == 0 || excess.max().item<double>() <= 0)
      << what << ": largest difference " << (g - w).abs().max().item<double>();
}

// A leaf of `sizes` in `dtype`, non-contiguous (every other column of a wider
// tensor) when asked.
at::Tensor leafOf(std::vector<int64_t> sizes, at::ScalarType dtype, bool contiguous, double scale = 1.0) {
  at::Tensor t;
  if (contiguous) {
    t = torch::randn(sizes, torch::kDouble) * scale;
  } else {
    std::vector<int64_t> wide = sizes;
    wide.back() *= 2;
    t = (torch::randn(wide, torch::kDouble) * scale).slice(-1, 0, wide.back(), 2);
  }
  return t.to(dtype).detach().requires_grad_(true);
}

// The reference's leaf: t's values in float64, with t's strides (a
// non-contiguous leaf stays non-contiguous).
at::Tensor cloneLeaf(const at::Tensor& t) {
  at::Tensor c = at::empty_strided(t.sizes(), t.strides(), t.options().dtype(torch::kDouble).requires_grad(false));
  c.copy_(t.detach());
  return c.requires_grad_(true);
}

// --- bias + GELU -------------------------------------------------------------

void checkBiasGelu(int64_t rows, int64_t n, bool tanh, at::ScalarType dtype, bool contiguous) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " n " << n << (tanh ? " tanh" : " erf") << " " << dtype
                                  << (contiguous ? "" : " non-contiguous"));
  const double tol = dtype == at::kDouble ? kDoubleTol : kFloatTol;
  at::Tensor h = leafOf({rows, n}, dtype, contiguous, 2.0), b = leafOf({n}, dtype, true);
  at::Tensor h2 = cloneLeaf(h), b2 = cloneLeaf(b);
  const int64_t before = fusedOpCalls();
  at::Tensor y = detail::biasGeluFused(h, b, tanh);
  EXPECT_EQ(fusedOpCalls(), before + 1);
  at::Tensor want = torch::gelu(h2 + b2, tanh ? "tanh" : "none");
  expectClose(y, want, tol, "y");
  const at::Tensor g = torch::randn_like(want);
  y.backward(g.to(dtype));
  want.backward(g);
  expectClose(h.grad(), h2.grad(), tol, "dh");
  expectClose(b.grad(), b2.grad(), tol, "db");
}

TEST(FusedOps, BiasGeluMatchesAtenInFloatAndDouble) {
  torch::manual_seed(1);
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (bool tanh : {false, true}) {
      for (int64_t rows : {1, 7, 31}) {
        for (int64_t n : {1, 7, 31, 257, 512}) checkBiasGelu(rows, n, tanh, dtype, true);
      }
      checkBiasGelu(31, 257, tanh, dtype, false);
      checkBiasGelu(257, 7, tanh, dtype, false);
    }
  }
}

TEST(FusedOps, BiasGeluOfABatchOfSequencesAndNoRows) {
  torch::manual_seed(2);
  at::Tensor h = torch::randn({2, 3, 16}, torch::kDouble).requires_grad_(true);
  at::Tensor b = torch::randn({16}, torch::kDouble).requires_grad_(true);
  at::Tensor y = detail::biasGeluFused(h, b, false);
  expectClose(y, torch::gelu(h + b), kDoubleTol, "[2, 3, 16]");
  at::Tensor empty = torch::randn({0, 16}, torch::kDouble).requires_grad_(true);
  at::Tensor b0 = torch::randn({16}, torch::kDouble).requires_grad_(true);
  detail::biasGeluFused(empty, b0, true).sum().backward();
  EXPECT_EQ(b0.grad().abs().sum().item<double>(), 0.0);
}

// Without a bias, the MLP's form (the bias inside the product before it);
// without gradients to keep, the values alone, bitwise those of the
// autograd path, and no graph.
TEST(FusedOps, GeluWithoutABiasAndWithoutGradientsToKeep) {
  torch::manual_seed(3);
  for (bool tanh : {false, true}) {
    SCOPED_TRACE(tanh ? "tanh" : "erf");
    at::Tensor h = (torch::randn({5, 3, 64}) * 3).requires_grad_(true);
    at::Tensor h2 = h.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor y = detail::biasGeluFused(h, {}, tanh);
    at::Tensor want = torch::gelu(h2, tanh ? "tanh" : "none");
    expectClose(y, want, kFloatTol, "y");
    const at::Tensor g = torch::randn_like(want);
    y.backward(g.to(at::kFloat));
    want.backward(g);
    expectClose(h.grad(), h2.grad(), kFloatTol, "dh");
    at::Tensor values;
    {
      torch::NoGradGuard noGrad;
      values = detail::biasGeluFused(h, {}, tanh);
    }
    EXPECT_FALSE(values.grad_fn());
    EXPECT_TRUE(torch::equal(values, y.detach()));
  }
}

// Float32's exact GELU takes erf as oneDNN's gelu_erf does (what ATen's
// float32 CPU gelu runs): within a few float roundings of exact, far
// into both tails.
TEST(FusedOps, FloatGeluStaysWithinRoundingOfTheExactOne) {
  at::Tensor h = torch::linspace(-12, 12, 48001);
  at::Tensor exact = torch::gelu(h.to(at::kDouble));
  at::Tensor y = detail::biasGeluFused(h.clone().requires_grad_(true), {}, false);
  // |error of erf| <= 1.5e-7, times |h| / 2, plus roundings of y.
  const at::Tensor bound = 1.5e-7 * h.to(at::kDouble).abs() / 2 + 2.4e-7 * (1 + exact.abs());
  const at::Tensor err = (y.detach().to(at::kDouble) - exact).abs();
  EXPECT_TRUE((err <= bound).all().item<bool>()) << "worst " << (err - bound).max().item<double>();
  // Negative tail: zero or a tiny negative value, never a positive one.
  EXPECT_LE(y.detach().slice(0, 0, 100).max().item<float>(), 0.0f);
}

// Neither form makes a subnormal float, in its output or its slope, however
// far into the tails: the products that read them would run on microcode
// assists.
TEST(FusedOps, FloatGeluMakesNoSubnormals) {
  for (bool tanh : {false, true}) {
    SCOPED_TRACE(tanh ? "tanh" : "erf");
    at::Tensor h = torch::linspace(-60, 60, 120001).requires_grad_(true);
    at::Tensor y = detail::biasGeluFused(h, {}, tanh);
    y.backward(torch::ones_like(y));
    for (const at::Tensor& t : {y.detach(), h.grad()}) {
      const at::Tensor subnormal = (t != 0) & (t.abs() < std::numeric_limits<float>::min());
      EXPECT_EQ(subnormal.sum().item<int64_t>(), 0);
    }
  }
}

// --- residual add + LayerNorm -----------------------------------------------

void checkAddNorm(int64_t rows, int64_t n, bool bias, at::ScalarType dtype, bool contiguous) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " n " << n << (bias ? " bias" : " no bias") << " " << dtype
                                  << (contiguous ? "" : " non-contiguous"));
  // Width 1: the centred value is rounding noise and rstd = 1/sqrt(eps) =
  // 316 scales one float rounding of it (6e-8) to 2e-5 in the gradients.
  const double tol = dtype == at::kDouble ? kDoubleTol : n == 1 ? kWidthOneFloatTol : kFloatTol;
  at::Tensor x = leafOf({rows, n}, dtype, contiguous, 3.0), d = leafOf({rows, n}, dtype, contiguous);
  at::Tensor w = leafOf({n}, dtype, true), b = bias ? leafOf({n}, dtype, true) : at::Tensor();
  at::Tensor x2 = cloneLeaf(x), d2 = cloneLeaf(d), w2 = cloneLeaf(w);
  at::Tensor b2 = bias ? cloneLeaf(b) : at::Tensor();
  const AddNorm got = detail::addLayerNormFused(x, d, w, b, 1e-5);
  const at::Tensor s = x2 + d2;
  const at::Tensor y = torch::layer_norm(s, {n}, w2, b2, 1e-5);
  expectClose(got.sum, s, tol, "s");
  expectClose(got.norm, y, tol, "layer_norm(s)");
  // Gradients from both outputs, as a block's residual stream sends them.
  const at::Tensor gs = torch::randn_like(s), gy = torch::randn_like(y);
  ((got.sum * gs.to(dtype)).sum() + (got.norm * gy.to(dtype)).sum()).backward();
  ((s * gs).sum() + (y * gy).sum()).backward();
  expectClose(x.grad(), x2.grad(), tol, "dx");
  expectClose(d.grad(), d2.grad(), tol, "ddelta");
  expectClose(w.grad(), w2.grad(), tol, "dweight");
  if (bias) expectClose(b.grad(), b2.grad(), tol, "dbias");
}

TEST(FusedOps, AddLayerNormMatchesAtenInFloatAndDouble) {
  torch::manual_seed(3);
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (bool bias : {true, false}) {
      for (int64_t rows : {1, 7, 31, 257}) {
        for (int64_t n : {1, 7, 31, 128}) checkAddNorm(rows, n, bias, dtype, true);
      }
      checkAddNorm(31, 257, bias, dtype, false);
      checkAddNorm(7, 128, bias, dtype, false);
    }
  }
}

TEST(FusedOps, AddLayerNormWithOneOutputUnused) {
  torch::manual_seed(4);
  at::Tensor x = torch::randn({5, 3, 31}, torch::kDouble).requires_grad_(true);
  at::Tensor d = torch::randn({5, 3, 31}, torch::kDouble);  // needs no gradient
  at::Tensor w = torch::randn({31}, torch::kDouble).requires_grad_(true);
  at::Tensor x2 = cloneLeaf(x), w2 = cloneLeaf(w);
  detail::addLayerNormFused(x, d, w, at::Tensor(), 1e-5).norm.sum().backward();
  torch::layer_norm(x2 + d, {31}, w2, {}, 1e-5).sum().backward();
  expectClose(x.grad(), x2.grad(), kDoubleTol, "dx");
  expectClose(w.grad(), w2.grad(), kDoubleTol, "dweight");
}

// Under bf16 autocast a float32 residual stream gets a bfloat16 branch: the
// fused op takes them, with the sum's bits (the branch widened exactly),
// the norm and the gradients within float32 rounding of autocast's ATen
// ops, the branch's gradient in bfloat16.
TEST(FusedOps, UnderBf16AutocastAddLayerNormTakesAFloatStreamAndABfloat16Branch) {
  FusedOpsScope on(true);
  torch::manual_seed(5);
  for (int64_t n : {7, 128}) {
    SCOPED_TRACE(n);
    const at::Tensor x0 = torch::randn({3, 17, n}) * 3, d0 = torch::randn({3, 17, n}).to(at::kBFloat16);
    const at::Tensor w0 = torch::randn({n}), b0 = torch::randn({n});
    const at::Tensor gs = torch::randn({3, 17, n}), gy = torch::randn({3, 17, n});
    auto run = [&](bool fused) {
      auto leaf = [](const at::Tensor& t) { return t.detach().clone().requires_grad_(true); };
      at::Tensor x = leaf(x0), d = leaf(d0), w = leaf(w0), b = leaf(b0);
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      const int64_t before = fusedOpCalls();
      AddNorm a;
      if (fused) {
        a = addLayerNorm(x, d, w, b, 1e-5);
      } else {
        a.sum = x + d;
        a.norm = torch::layer_norm(a.sum, {n}, w, b, 1e-5);
      }
      const int64_t calls = fusedOpCalls() - before;
      EXPECT_TRUE(at::autocast::is_cpu_enabled()) << "autocast left off";
      at::autocast::set_cpu_enabled(false);
      at::autocast::clear_cache();
      ((a.sum * gs).sum() + (a.norm * gy).sum()).backward();
      return std::tuple{calls, a, x.grad(), d.grad(), w.grad(), b.grad()};
    };
    const auto [calls, got, dx, dd, dw, db] = run(true);
    const auto [plainCalls, want, dx2, dd2, dw2, db2] = run(false);
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(plainCalls, 0);
    EXPECT_EQ(got.sum.scalar_type(), at::kFloat);
    EXPECT_EQ(got.norm.scalar_type(), want.norm.scalar_type());
    EXPECT_TRUE(torch::equal(got.sum, want.sum));
    expectClose(got.norm, want.norm, kFloatTol, "layer_norm(s)");
    expectClose(dx, dx2, kFloatTol, "dx");
    ASSERT_EQ(dd.scalar_type(), at::kBFloat16);
    // The branch's gradient: the same float32 value rounded to bfloat16,
    // so at most one bfloat16 step apart.
    expectClose(dd.to(at::kFloat), dd2.to(at::kFloat), 1.0 / 128, "ddelta");
    expectClose(dw, dw2, kFloatTol, "dweight");
    expectClose(db, db2, kFloatTol, "dbias");
  }
}

// --- BatchNorm + ReLU (training) ---------------------------------------------

void checkBatchNormRelu(std::vector<int64_t> sizes, at::ScalarType dtype, const std::string& layout) {
  SCOPED_TRACE(testing::Message() << "[" << sizes[0] << ", " << sizes[1] << ", " << sizes[2] << ", " << sizes[3]
                                  << "] " << dtype << " " << layout);
  const double tol = dtype == at::kDouble ? kDoubleTol : kBnFloatTol;
  at::Tensor x = torch::randn(sizes, torch::kDouble) * 2 + 0.5;
  if (layout == "channels_last") x = x.contiguous(at::MemoryFormat::ChannelsLast);
  if (layout == "strided") x = torch::randn({sizes[0], sizes[1], sizes[2], 2 * sizes[3]}).slice(3, 0, 2 * sizes[3], 2);
  x = x.to(dtype).detach().requires_grad_(true);
  const int64_t c = sizes[1];
  at::Tensor w = leafOf({c}, dtype, true), b = leafOf({c}, dtype, true);
  at::Tensor x2 = cloneLeaf(x), w2 = cloneLeaf(w), b2 = cloneLeaf(b);
  at::Tensor mean = torch::randn({c}, dtype), var = torch::rand({c}, dtype) + 0.5;
  at::Tensor mean2 = mean.to(torch::kDouble), var2 = var.to(torch::kDouble);
  at::Tensor y = detail::batchNormReluFused(x, w, b, mean, var, 0.1, 1e-5);
  at::Tensor want = torch::relu(torch::batch_norm(x2, w2, b2, mean2, var2, true, 0.1, 1e-5, false));
  expectClose(y, want, tol, "y");
  if (layout == "channels_last") {
    EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
  }
  expectClose(mean, mean2, tol, "running mean");
  expectClose(var, var2, tol, "running var");
  const at::Tensor g = torch::randn_like(want);
  y.backward(g.to(dtype));
  want.backward(g);
  expectClose(x.grad(), x2.grad(), tol, "dx");
  expectClose(w.grad(), w2.grad(), tol, "dweight");
  expectClose(b.grad(), b2.grad(), tol, "dbias");
}

TEST(FusedOps, BatchNormReluMatchesAtenInFloatAndDouble) {
  torch::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes = {{2, 3, 5, 7}, {7, 1, 1, 1}, {1, 7, 1, 2}, {1, 31, 7, 1},
                                                    {3, 257, 2, 3}, {5, 7, 31, 3}, {2, 64, 16, 16}};
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (const auto& s : shapes) {
      for (const char* layout : {"contiguous", "channels_last", "strided"}) checkBatchNormRelu(s, dtype, layout);
    }
  }
}

TEST(FusedOps, BatchNormOfOneValuePerChannelFailsAsAtenDoes) {
  at::Tensor x = torch::randn({1, 3, 1, 1});
  at::Tensor w = torch::ones({3}), b = torch::zeros({3}), m = torch::zeros({3}), v = torch::ones({3});
  EXPECT_THROW(detail::batchNormReluFused(x, w, b, m, v, 0.1, 1e-5), c10::Error);
  torch::nn::BatchNorm2d bn(3);
  FusedOpsScope on(true);
  EXPECT_THROW(batchNormRelu(*bn, x), c10::Error);
}

// The module form: running statistics and num_batches_tracked as
// BatchNorm2d's training forward leaves them, with a momentum and with a
// cumulative average (no momentum); eval mode takes bn's own forward.
TEST(FusedOps, BatchNormModuleStateMatchesBatchNorm2d) {
  FusedOpsScope on(true);
  torch::manual_seed(6);
  for (bool cumulative : {false, true}) {
    torch::nn::BatchNorm2dOptions o(5);
    if (cumulative) o.momentum(c10::nullopt);
    torch::nn::BatchNorm2d fused(o), plain(o);
    fused->train();
    plain->train();
    for (int step = 0; step < 3; ++step) {
      at::Tensor x = torch::randn({4, 5, 3, 3}, torch::kDouble).to(torch::kFloat);
      const int64_t before = fusedOpCalls();
      at::Tensor y = batchNormRelu(*fused, x);
      EXPECT_EQ(fusedOpCalls(), before + 1);
      expectClose(y, torch::relu(plain(x)), kBnFloatTol, "y");
    }
    expectClose(fused->running_mean, plain->running_mean, kBnFloatTol, "running mean");
    expectClose(fused->running_var, plain->running_var, kBnFloatTol, "running var");
    EXPECT_EQ(fused->num_batches_tracked.item<int64_t>(), 3);
    fused->eval();
    plain->eval();
    at::Tensor x = torch::randn({2, 5, 3, 3});
    const int64_t before = fusedOpCalls();
    expectClose(batchNormRelu(*fused, x), torch::relu(plain(x)), kBnFloatTol, "eval");
    EXPECT_EQ(fusedOpCalls(), before);
  }
}

// On by default where a vector build of the loops runs (fused_ops.h), off
// without one; FusedOpsScope turns them on or off for a thread.
TEST(FusedOps, OnByDefaultWhereAVectorBuildRuns) {
  const bool vectorBuild = std::string(detail::fusedKernelsIsa()) != "base";
  const char* held = std::getenv("COHORT_FUSED_OPS");
  const bool heldOff = held != nullptr && std::string(held) == "off";
  EXPECT_EQ(fusedOpsByDefault(), vectorBuild && !heldOff);
  EXPECT_EQ(fusedOpsOn(), fusedOpsByDefault());
  EXPECT_EQ(fusedOpsDescription(), heldOff       ? "off (COHORT_FUSED_OPS)"
                                   : vectorBuild ? detail::fusedKernelsIsa()
                                                 : "off (no AVX2)");
  torch::nn::BatchNorm2d bn(3);
  int64_t before = fusedOpCalls();
  {
    FusedOpsScope off(false);
    EXPECT_FALSE(fusedOpsOn());
    batchNormRelu(*bn, torch::randn({2, 3, 4, 4}));
    addLayerNorm(torch::randn({2, 8}), torch::randn({2, 8}), torch::ones({8}), {}, 1e-5);
    EXPECT_EQ(fusedOpCalls(), before);
    FusedOpsScope on(true);
    EXPECT_TRUE(fusedOpsOn());
    batchNormRelu(*bn, torch::randn({2, 3, 4, 4}));
    EXPECT_EQ(fusedOpCalls(), before + 1);
  }
  EXPECT_EQ(fusedOpsOn(), fusedOpsByDefault());
  before = fusedOpCalls();
  addLayerNorm(torch::randn({2, 8}), torch::randn({2, 8}), torch::ones({8}), {}, 1e-5);
  EXPECT_EQ(fusedOpCalls(), before + (fusedOpsByDefault() ? 1 : 0));
}

// --- fallbacks and threads ---------------------------------------------------

TEST(FusedOps, OtherDtypesAndAutocastTakeTheAtenOps) {
  FusedOpsScope on(true);
  torch::manual_seed(7);
  at::Tensor h = torch::randn({7, 31}).to(torch::kBFloat16), b = torch::randn({31}).to(torch::kBFloat16);
  at::Tensor w = torch::randn({31});
  const int64_t before = fusedOpCalls();
  EXPECT_TRUE(torch::equal(biasGelu(h, b, false), torch::gelu(h + b)));
  const AddNorm mixed = addLayerNorm(torch::randn({7, 31}), h, w, {}, 1e-5);  // float + bfloat16
  EXPECT_EQ(mixed.sum.scalar_type(), at::kFloat);
  EXPECT_FALSE(detail::fusedKernelsTake({torch::randn({3}), torch::randn({3}).to(torch::kHalf)}));
  at::autocast::set_cpu_enabled(true);
  EXPECT_FALSE(detail::fusedKernelsTake({torch::randn({3})}));
  at::autocast::set_cpu_enabled(false);
  EXPECT_EQ(fusedOpCalls(), before);
  EXPECT_THROW(detail::biasGeluFused(h, b, false), c10::Error);
}

// Sums over rows go in fixed blocks: one thread and two give the same bits.
TEST(FusedOps, GradientsDoNotDependOnTheThreadCount) {
  torch::manual_seed(8);
  at::Tensor x = torch::randn({257, 128}), d = torch::randn({257, 128}), w = torch::randn({128});
  at::Tensor img = torch::randn({8, 16, 9, 9}).contiguous(at::MemoryFormat::ChannelsLast);
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    at::Tensor wl = w.clone().requires_grad_(true);
    detail::addLayerNormFused(x, d, wl, {}, 1e-5).norm.pow(2).sum().backward();
    at::Tensor bw = torch::ones({16}).requires_grad_(true), bb = torch::zeros({16}).requires_grad_(true);
    detail::batchNormReluFused(img, bw, bb, {}, {}, 0.1, 1e-5).pow(2).sum().backward();
    return std::vector<at::Tensor>{wl.grad(), bw.grad(), bb.grad()};
  };
  const int threads = at::get_num_threads();
  const std::vector<at::Tensor> one = run(1), two = run(2);
  at::set_num_threads(threads);
  for (size_t k = 0; k < one.size(); ++k) EXPECT_TRUE(torch::equal(one[k], two[k])) << k;
}

// --- the models -------------------------------------------------------------

// A training forward and backward of `m` on `input` (a loss of every
// logit): the logits, then each parameter's gradient, by name.
std::vector<std::pair<std::string, at::Tensor>> fusedTrainStep(Model& m, const at::Tensor& input) {
  m.zero_grad();
  const at::Tensor out = m.forward(input);
  (out * out).mean().backward();
  std::vector<std::pair<std::string, at::Tensor>> r{{"logits", out.detach()}};
  for (const auto& p : m.named_parameters()) r.emplace_back(p.key(), p.value().grad().clone());
  return r;
}

void expectSameStep(Model& m, const at::Tensor& input, double tol) {
  std::vector<std::pair<std::string, at::Tensor>> fused, plain;
  {
    FusedOpsScope on(true);
    const int64_t before = fusedOpCalls();
    fused = fusedTrainStep(m, input);
    EXPECT_GT(fusedOpCalls(), before);
  }
  {
    FusedOpsScope off(false);
    const int64_t calls = fusedOpCalls();
    plain = fusedTrainStep(m, input);
    EXPECT_EQ(fusedOpCalls(), calls);
  }
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t k = 0; k < fused.size(); ++k) {
    EXPECT_TRUE(torch::allclose(fused[k].second, plain[k].second, tol, tol))
        << fused[k].first << ": " << (fused[k].second - plain[k].second).abs().max().item<double>();
  }
}

TEST(FusedOps, GptTrainsAlikeWithAndWithoutTheFusedOps) {
  GptOptions o;
  o.vocabSize = 11;
  o.blockSize = 8;
  o.nLayer = 2;
  o.nHead = 2;
  o.nEmbd = 16;
  o.dropout = 0;
  for (bool bias : {true, false}) {
    for (bool tanh : {false, true}) {
      SCOPED_TRACE(testing::Message() << (bias ? "bias" : "no bias") << (tanh ? " tanh" : " erf"));
      o.bias = bias;
      o.geluTanh = tanh;
      torch::manual_seed(9);
      std::shared_ptr<Model> m = createGpt(o);
      m->train();
      expectSameStep(*m, torch::randint(11, {3, 8}, torch::kLong), kFloatTol);
    }
  }
}

// Whether the gradient of the parameter `name` of `m` reaches it from a
// node of `output`'s graph whose name contains `node`.
bool gradientComesThrough(const Model& m, const at::Tensor& output, const std::string& node, const std::string& name) {
  const at::Tensor param = m.named_parameters()[name];
  for (torch::autograd::Node* n : test::graphNodes(output)) {
    if (n->name().find(node) == std::string::npos) continue;
    for (const torch::autograd::Edge& e : n->next_edges()) {
      auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(e.function.get());
      if (acc != nullptr && acc->variable.is_same(param)) return true;
    }
  }
  return false;
}

// The GPT's c_fc bias is added in the fused GELU's pass, and its gradient
// summed in that op's backward; with fused ops off, by the linear layer.
TEST(FusedOps, TheGptsMlpBiasGoesThroughTheFusedGelu) {
  torch::manual_seed(3);
  std::shared_ptr<Model> m = createGpt(test::gptSizes(11, 8, 1, 2, 16));
  m->train();
  const at::Tensor tokens = torch::randint(11, {2, 8}, torch::kLong);
  const std::string bias = "transformer.h.0.mlp.c_fc.bias";
  EXPECT_TRUE(gradientComesThrough(*m, m->forward(tokens), "BiasGelu", bias));
  FusedOpsScope off(false);
  EXPECT_FALSE(gradientComesThrough(*m, m->forward(tokens), "BiasGelu", bias));
}

TEST(FusedOps, ResNetTrainsAlikeWithAndWithoutTheFusedOps) {
  for (bool channelsLast : {false, true}) {
    SCOPED_TRACE(channelsLast ? "channels_last" : "contiguous");
    ModelConfig c;
    c.arch = ModelArch::resnet18;
    c.numClasses = 10;
    c.smallInput = true;
    c.memoryFormat = channelsLast ? MemoryLayout::channelsLast : MemoryLayout::contiguous;
    torch::manual_seed(10);
    std::shared_ptr<Model> m = createModel(c, {3, 8, 8});
    m->train();
    expectSameStep(*m, torch::randn({4, 3, 8, 8}), 1e-3);
  }
}

// The Fashion-MNIST example's CNN takes the fused BatchNorm + ReLU twice a
// step (bn1, bn2) and trains as with ATen's ops.
TEST(FusedOps, SimpleCnnTrainsAlikeWithAndWithoutTheFusedOps) {
  ModelConfig c;
  c.arch = ModelArch::simpleCnn;
  c.numClasses = 10;
  c.batchNorm = true;
  c.dropout = 0;
  torch::manual_seed(11);
  std::shared_ptr<Model> m = createModel(c, {1, 12, 12});
  m->train();
  const at::Tensor input = torch::randn({4, 1, 12, 12});
  int64_t before = 0;
  {
    FusedOpsScope on(true);
    before = fusedOpCalls();
    m->forward(input);
    EXPECT_EQ(fusedOpCalls(), before + 2);
  }
  expectSameStep(*m, input, 1e-4);
}

}  // namespace
}  // namespace cohort::models
