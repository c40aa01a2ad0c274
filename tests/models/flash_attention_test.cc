// The blockwise causal attention kernel (models/flash_attention.h) against
// the product of the whole score matrix written out in ATen: forward in
// float32 (within 2e-5 + 1e-4 relative) and float64 (1e-12), gradients of q,
// k and v in float64 against ATen's autograd (1e-10) and against finite
// differences, in float32 against float64's (1e-4 + 1e-3 relative); shapes around the block size (64), primes, T = 1, D = 1,
// non-contiguous inputs as the GPT makes them, many heads; bfloat16.

#include "models/flash_attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cohort/models/gpt.h"
#include "models/softmax_rows.h"
#include "util/autograd_graph.h"
#include "util/gpt.h"

namespace cohort::models {
namespace {

struct AttentionShape {
  int64_t b, h, t, d;
};

// Every shape the kernel must get right: T = 1, primes, multiples of the
// block size and one past them, head dim 1 and odd ones, B = 1, many heads.
const std::vector<AttentionShape> kAttentionShapes = {
    {1, 1, 1, 1},  {1, 1, 1, 32},  {2, 3, 7, 5},   {1, 2, 31, 32}, {2, 1, 64, 16}, {1, 1, 65, 1},
    {1, 1, 128, 8}, {1, 2, 257, 7}, {1, 16, 13, 4}, {3, 2, 100, 33}, {1, 1, 2, 3},
};

// softmax(q k^T / sqrt(D) with the future masked) v, [B, T, H D], in ATen.
at::Tensor referenceAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  const at::Tensor future = torch::ones({t, t}, torch::kBool).triu(1);
  const at::Tensor p = torch::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  return torch::matmul(p, v).transpose(1, 2).contiguous().view({b, t, h * d});
}

std::vector<at::Tensor> randomQkv(const AttentionShape& s, at::ScalarType dtype, bool grad) {
  std::vector<at::Tensor> out;
  for (int i = 0; i < 3; ++i) {
    out.push_back(torch::randn({s.b, s.h, s.t, s.d}, torch::dtype(dtype)).set_requires_grad(grad));
  }
  return out;
}

::testing::AssertionResult closeTo(const at::Tensor& got, const at::Tensor& want, double rtol, double atol) {
  if (got.sizes() != want.sizes()) {
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " vs " << want.sizes();
  }
  if (got.allclose(want, rtol, atol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |difference| " << (got - want).abs().max().item<double>();
}

std::string describe(const AttentionShape& s) {
  return "B " + std::to_string(s.b) + " H " + std::to_string(s.h) + " T " + std::to_string(s.t) + " D " +
         std::to_string(s.d);
}

// The softmax's row kernels in each build this CPU runs (the scalar loops,
// AVX2, AVX-512), over rows of lengths that leave tails for the narrower
// ones: exp within 2 ulp of std::exp down to -87 and exp(-87) = 1.6e-38
// below, the returned sum the sum of what was written (to float rounding),
// and the maximum exactly the largest element.
TEST(FlashAttention, TheRowKernelsOfEveryBuildAgreeWithTheStandardLibrary) {
  using detail::RowBuild;
  std::vector<RowBuild> builds{RowBuild::scalar};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) builds.push_back(RowBuild::avx2);
  if (__builtin_cpu_supports("avx512f")) builds.push_back(RowBuild::avx512);
#endif
  const float shift = 3.5f;
  for (RowBuild build : builds) {
    for (int64_t n : {1, 7, 8, 15, 16, 31, 64, 1000}) {
      SCOPED_TRACE(testing::Message() << "build " << static_cast<int>(build) << " n " << n);
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[i] = shift - 100.0f * static_cast<float>((i * 37) % n) / static_cast<float>(n);
      EXPECT_EQ(detail::rowMax(build, x.data(), n), *std::max_element(x.begin(), x.end()));
      const std::vector<float> in = x;
      const float sum = detail::expShiftedInPlace(build, x.data(), n, shift);
      double written = 0;
      for (int64_t i = 0; i < n; ++i) {
        written += x[i];
        const float want = std::exp(in[i] - shift);
        if (in[i] - shift >= -87.0f) {
          EXPECT_LE(std::abs(x[i] - want), 2 * (std::nextafter(want, std::numeric_limits<float>::infinity()) - want))
              << "x " << in[i] - shift << ": " << x[i] << " vs " << want;
        } else {
          EXPECT_NEAR(x[i], std::exp(-87.0f), 2e-45f) << "x " << in[i] - shift;
        }
      }
      EXPECT_NEAR(sum, written, 1e-6 * written);
    }
  }
  EXPECT_EQ(detail::rowMax(RowBuild::scalar, nullptr, 0), -std::numeric_limits<float>::infinity());
}

TEST(FlashAttention, ForwardEqualsTheWholeMatrixInFloatAndDouble) {
  torch::manual_seed(1);
  for (const AttentionShape& s : kAttentionShapes) {
    for (const auto& [dtype, rtol, atol] :
         {std::tuple{at::kFloat, 1e-4, 2e-5}, std::tuple{at::kDouble, 1e-12, 1e-12}}) {
      const std::vector<at::Tensor> qkv = randomQkv(s, dtype, false);
      const at::Tensor got = flashAttention(qkv[0], qkv[1], qkv[2]);
      EXPECT_EQ(got.scalar_type(), dtype);
      EXPECT_TRUE(closeTo(got, referenceAttention(qkv[0], qkv[1], qkv[2]), rtol, atol)) << describe(s) << " " << dtype;
    }
  }
}

TEST(FlashAttention, GradientsEqualAutogradsOfTheWholeMatrixInDouble) {
  torch::manual_seed(2);
  for (const AttentionShape& s : kAttentionShapes) {
    const std::vector<at::Tensor> qkv = randomQkv(s, at::kDouble, true);
    const at::Tensor weight = torch::randn({s.b, s.t, s.h * s.d}, torch::kDouble);
    const at::Tensor got = flashAttention(qkv[0], qkv[1], qkv[2]);
    const std::vector<at::Tensor> gotGrads = torch::autograd::grad({(got * weight).sum()}, qkv);
    const at::Tensor want = referenceAttention(qkv[0], qkv[1], qkv[2]);
    const std::vector<at::Tensor> wantGrads = torch::autograd::grad({(want * weight).sum()}, qkv);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(closeTo(gotGrads[i], wantGrads[i], 1e-10, 1e-10)) << describe(s) << " gradient of " << "qkv"[i];
    }
  }
}

TEST(FlashAttention, GradientsEqualFiniteDifferences) {
  torch::manual_seed(3);
  const AttentionShape s{1, 2, 5, 3};
  std::vector<at::Tensor> qkv = randomQkv(s, at::kDouble, true);
  const at::Tensor weight = torch::randn({s.b, s.t, s.h * s.d}, torch::kDouble);
  const std::vector<at::Tensor> grads =
      torch::autograd::grad({(flashAttention(qkv[0], qkv[1], qkv[2]) * weight).sum()}, qkv);
  torch::NoGradGuard noGrad;
  const double eps = 1e-6;
  for (size_t i = 0; i < 3; ++i) {
    at::Tensor flat = qkv[i].view({-1});
    for (int64_t j = 0; j < flat.numel(); ++j) {
      const double x = flat[j].item<double>();
      flat[j] = x + eps;
      const double up = (flashAttention(qkv[0], qkv[1], qkv[2]) * weight).sum().item<double>();
      flat[j] = x - eps;
      const double down = (flashAttention(qkv[0], qkv[1], qkv[2]) * weight).sum().item<double>();
      flat[j] = x;
      EXPECT_NEAR(grads[i].reshape({-1})[j].item<double>(), (up - down) / (2 * eps), 1e-7) << "qkv"[i] << " " << j;
    }
  }
}

// Float32's gradients, which the tile kernels of the widest build compute
// (models/fused_kernels.h; BLAS at the baseline), against ATen's autograd of
// the whole matrix in float64 on the same values: within float rounding of
// sums over T terms (the run under `/avx2` takes the AVX2 build).
TEST(FlashAttention, FloatGradientsEqualTheWholeMatrixsInDouble) {
  torch::manual_seed(7);
  std::vector<AttentionShape> shapes = kAttentionShapes;
  shapes.push_back({2, 4, 256, 32});  // the GPT example's heads
  for (const AttentionShape& s : shapes) {
    const std::vector<at::Tensor> qkv = randomQkv(s, at::kFloat, true);
    const at::Tensor weight = torch::randn({s.b, s.t, s.h * s.d});
    const std::vector<at::Tensor> gotGrads =
        torch::autograd::grad({(flashAttention(qkv[0], qkv[1], qkv[2]) * weight).sum()}, qkv);
    std::vector<at::Tensor> wide;
    for (const at::Tensor& x : qkv) wide.push_back(x.detach().to(at::kDouble).set_requires_grad(true));
    const std::vector<at::Tensor> wantGrads = torch::autograd::grad(
        {(referenceAttention(wide[0], wide[1], wide[2]) * weight.to(at::kDouble)).sum()}, wide);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(gotGrads[i].scalar_type(), at::kFloat);
      EXPECT_TRUE(closeTo(gotGrads[i].to(at::kDouble), wantGrads[i], 1e-3, 1e-4))
          << describe(s) << " gradient of " << "qkv"[i];
    }
  }
}

// q, k, v as the GPT makes them: views of one projection [B, T, 3 H D],
// split and transposed to [B, H, T, D], none contiguous.
TEST(FlashAttention, TakesTheGptsNonContiguousViews) {
  torch::manual_seed(4);
  for (const AttentionShape& s :
       {AttentionShape{2, 4, 67, 8}, AttentionShape{1, 3, 1, 5}, AttentionShape{2, 2, 9, 1}}) {
    const at::Tensor projected = torch::randn({s.b, s.t, 3 * s.h * s.d}, torch::kDouble).set_requires_grad(true);
    std::vector<at::Tensor> qkv;
    for (const at::Tensor& m : projected.split(s.h * s.d, 2)) {
      qkv.push_back(m.view({s.b, s.t, s.h, s.d}).transpose(1, 2));
    }
    if (s.t > 1) {
      EXPECT_FALSE(qkv[0].is_contiguous());
    }
    const at::Tensor weight = torch::randn({s.b, s.t, s.h * s.d}, torch::kDouble);
    const at::Tensor got = flashAttention(qkv[0], qkv[1], qkv[2]);
    const at::Tensor gotGrad = torch::autograd::grad({(got * weight).sum()}, {projected})[0];
    const at::Tensor want = referenceAttention(qkv[0], qkv[1], qkv[2]);
    const at::Tensor wantGrad = torch::autograd::grad({(want * weight).sum()}, {projected})[0];
    EXPECT_TRUE(closeTo(got, want, 1e-12, 1e-12)) << describe(s);
    EXPECT_TRUE(closeTo(gotGrad, wantGrad, 1e-10, 1e-10)) << describe(s);
  }
}

// One projection taken whole (flashAttentionPacked, which the GPT's
// causalAttentionPacked takes): the same values as the kernel on its three
// views, bitwise, and one gradient equal to the three side by side; float32
// and float64, a non-contiguous projection, and what it does not take.
TEST(FlashAttention, APackedProjectionGivesTheViewsResultAndOneGradient) {
  torch::manual_seed(7);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (const AttentionShape& s :
         {AttentionShape{2, 4, 67, 8}, AttentionShape{1, 3, 1, 5}, AttentionShape{2, 2, 130, 1}}) {
      for (bool strided : {false, true}) {
        SCOPED_TRACE(describe(s) + (strided ? " strided" : "") + (dtype == at::kFloat ? " float" : " double"));
        const int64_t c = s.h * s.d;
        at::Tensor wide = torch::randn({s.b, s.t, strided ? 6 * c : 3 * c}, dtype);
        const at::Tensor base = strided ? wide.slice(2, 0, 6 * c, 2) : wide;
        const at::Tensor packed = base.detach().set_requires_grad(true);
        ASSERT_TRUE(flashAttentionPackedApplies(packed, s.h));
        const at::Tensor viewsOf = base.detach().clone().set_requires_grad(true);
        const auto views = headsOf(viewsOf, s.h);
        const at::Tensor weight = torch::randn({s.b, s.t, c}, dtype);
        const at::Tensor got = flashAttentionPacked(packed, s.h);
        const at::Tensor want = flashAttention(views[0], views[1], views[2]);
        EXPECT_TRUE(torch::equal(got, want));
        const at::Tensor gotGrad = torch::autograd::grad({(got * weight).sum()}, {packed})[0];
        const at::Tensor wantGrad = torch::autograd::grad({(want * weight).sum()}, {viewsOf})[0];
        EXPECT_EQ(gotGrad.sizes(), packed.sizes());
        EXPECT_TRUE(torch::equal(gotGrad, wantGrad));
      }
    }
  }
  const at::Tensor qkv = torch::randn({2, 5, 24});
  EXPECT_FALSE(flashAttentionPackedApplies(qkv, 5)) << "24 is not 3 x a multiple of 5 heads";
  EXPECT_FALSE(flashAttentionPackedApplies(qkv.to(at::kBFloat16), 2));
  EXPECT_FALSE(flashAttentionPackedApplies(qkv.view({2, 5, 2, 12}), 2));
  // With dropout on the weights causalAttentionPacked splits the projection
  // and keeps the whole matrix: the same values up to rounding.
  at::Tensor mask;
  const at::Tensor flash = causalAttentionPacked(qkv, 2, mask, torch::dtype(torch::kFloat));
  EXPECT_FALSE(mask.defined());
  const at::Tensor dropped =
      causalAttentionPacked(qkv, 2, mask, torch::dtype(torch::kFloat), [](const at::Tensor& a) { return a; });
  EXPECT_TRUE(mask.defined());
  EXPECT_TRUE(closeTo(flash, dropped, 1e-4, 2e-5));

  // The GPT's attention takes it.
  const std::shared_ptr<Model> gpt = createGpt(test::gptSizes(11, 8, 1, 2, 16));
  gpt->train();
  const at::Tensor logits = gpt->forward(torch::randint(11, {2, 8}, torch::kLong));  // holds the graph
  bool packedNode = false;
  for (torch::autograd::Node* n : test::graphNodes(logits)) {
    packedNode = packedNode || n->name().find("FlashAttentionPacked") != std::string::npos;
  }
  EXPECT_TRUE(packedNode);
}

// The backward writes every row of dq, dk and dv before adding to it:
// gradients given full of NaN come out as into fresh memory, float32
// (the kernels' tiles) and float64 (BLAS).
TEST(FlashAttention, TheBackwardOverwritesTheGradientsItIsGiven) {
  torch::manual_seed(8);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    const AttentionShape s{2, 3, 131, 8};
    const std::vector<at::Tensor> qkv = randomQkv(s, dtype, false);
    const auto [out, lse] = detail::flashForward(qkv[0], qkv[1], qkv[2]);
    const at::Tensor dOut = torch::randn_like(out);
    const auto [dq, dk, dv] = detail::flashBackward(qkv[0], qkv[1], qkv[2], out, lse, dOut);
    std::vector<at::Tensor> into;
    for (int i = 0; i < 3; ++i) into.push_back(torch::full({s.b, s.t, s.h, s.d}, NAN, out.options()));
    detail::flashBackwardInto(qkv[0], qkv[1], qkv[2], out, lse, dOut, into[0], into[1], into[2]);
    EXPECT_TRUE(torch::equal(into[0].transpose(1, 2), dq)) << dtype;
    EXPECT_TRUE(torch::equal(into[1].transpose(1, 2), dk)) << dtype;
    EXPECT_TRUE(torch::equal(into[2].transpose(1, 2), dv)) << dtype;
  }
}

// bfloat16, when asked for (causalAttention keeps the whole matrix for it),
// is computed in float32: the float result on the same inputs, rounded once.
TEST(FlashAttention, BFloat16IsComputedInFloat) {
  torch::manual_seed(5);
  const AttentionShape s{2, 2, 70, 16};
  const std::vector<at::Tensor> qkv = randomQkv(s, at::kBFloat16, true);
  const at::Tensor got = flashAttention(qkv[0], qkv[1], qkv[2]);
  ASSERT_EQ(got.scalar_type(), at::kBFloat16);
  const at::Tensor want = referenceAttention(qkv[0].to(at::kFloat), qkv[1].to(at::kFloat), qkv[2].to(at::kFloat));
  EXPECT_TRUE(closeTo(got.to(at::kFloat), want, 1e-2, 1e-2));
  const std::vector<at::Tensor> grads = torch::autograd::grad({got.to(at::kFloat).sum()}, qkv);
  for (const at::Tensor& g : grads) EXPECT_EQ(g.scalar_type(), at::kBFloat16);
}

// causalAttention (models/gpt.h) takes the kernel without dropout and keeps
// the product of the whole matrix with it, or when held to it.
TEST(FlashAttention, CausalAttentionChoosesItWithoutDropout) {
  torch::manual_seed(6);
  const std::vector<at::Tensor> qkv = randomQkv({2, 4, 40, 8}, at::kFloat, false);
  at::Tensor mask;
  const at::Tensor flash = causalAttention(qkv[0], qkv[1], qkv[2], mask, torch::dtype(torch::kFloat));
  EXPECT_FALSE(mask.defined());
  const at::Tensor dropped = causalAttention(qkv[0], qkv[1], qkv[2], mask, torch::dtype(torch::kFloat),
                                             [](const at::Tensor& a) { return a; });
  EXPECT_TRUE(mask.defined());
  EXPECT_TRUE(closeTo(flash, dropped, 1e-4, 2e-5));
  setAttentionMatmulOnly(true);
  EXPECT_FALSE(flashAttentionApplies(qkv[0], qkv[1], qkv[2]));
  setAttentionMatmulOnly(false);
  EXPECT_TRUE(flashAttentionApplies(qkv[0], qkv[1], qkv[2]));
  EXPECT_FALSE(flashAttentionApplies(qkv[0].to(at::kHalf), qkv[1].to(at::kHalf), qkv[2].to(at::kHalf)));
  // bfloat16 is taken, but causalAttention keeps LibTorch's bfloat16 products.
  const std::vector<at::Tensor> bf16 = {qkv[0].to(at::kBFloat16), qkv[1].to(at::kBFloat16), qkv[2].to(at::kBFloat16)};
  EXPECT_TRUE(flashAttentionTakes(bf16[0], bf16[1], bf16[2]));
  EXPECT_FALSE(flashAttentionApplies(bf16[0], bf16[1], bf16[2]));
}

}  // namespace
}  // namespace cohort::models
