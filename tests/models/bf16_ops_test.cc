// The fused ops on bfloat16 (cohort/models/fused_ops.h) against float64 on
// the same bfloat16 values. The causal softmax of attention: values and
// gradients within bfloat16's rounding, on T = 1, primes, vector widths and
// one past them; what lies above the diagonal ignored; non-contiguous
// scores; the fallbacks; the same bits on any thread count and on each
// instruction set's build. GELU with its slope kept: values and gradients
// within rounding, exact and tanh, on sizes that leave vector tails. A linear
// layer's bias. A GPT under bf16 autocast taking them.

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cohort/models/gpt.h"
#include "cohort/models/model.h"
#include "models/attention.h"
#include "models/fused_kernels.h"
#include "models/fused_ops.h"

namespace cohort::models {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// One rounding to bfloat16 is within half its 8-bit significand's step:
// 2^-9 to 2^-8 of the value. The gradient y (gy - sum(y gy)) takes the
// rounding of y, of the sum through y, and its own, and float32's
// arithmetic on top.
constexpr double kBf16Rel = 1.0 / 256;
constexpr double kGradRel = 2.0 / 256 + 1.0 / 4096;

// Where query i of the last q of t positions sees no key: j > t - q + i.
at::Tensor hiddenOf(int64_t q, int64_t t) { return torch::ones({q, t}, torch::kBool).triu(t - q + 1); }

// Causal scores [lead..., q, t] in bfloat16 (q = 0: t), -inf where hidden.
at::Tensor scoresOf(std::vector<int64_t> lead, int64_t t, uint64_t seed, int64_t q = 0) {
  torch::manual_seed(seed);
  q = q > 0 ? q : t;
  lead.push_back(q);
  lead.push_back(t);
  return (torch::randn(lead, torch::kDouble) * 3).masked_fill(hiddenOf(q, t), -kInf).to(at::kBFloat16);
}

// The float64 softmax of the bfloat16 scores, and its gradient for gy.
struct Reference {
  at::Tensor y, gx;
};
Reference referenceOf(const at::Tensor& scores, const at::Tensor& gy) {
  const at::Tensor x = scores.to(torch::kDouble).requires_grad_(true);
  const at::Tensor y = torch::softmax(x, -1);
  y.backward(gy.to(torch::kDouble));
  return {y.detach(), x.grad()};
}

// |got - want| <= tol elementwise, naming the worst.
void expectWithin(const at::Tensor& got, const at::Tensor& want, const at::Tensor& tol, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor excess = (got.to(torch::kDouble) - want).abs() - tol;
  const int64_t at = excess.flatten().argmax().item<int64_t>();
  EXPECT_LE(excess.max().item<double>(), 0.0)
      << what << ": at flat index " << at << ", " << got.to(torch::kDouble).flatten()[at].item<double>()
      << " against " << want.flatten()[at].item<double>() << " (tolerance " << tol.flatten()[at].item<double>()
      << ")";
}

// The builds of the bfloat16 loops this CPU runs, the baseline first.
std::vector<std::pair<std::string, const detail::Bf16KernelTable*>> bf16Builds() {
  using Tag = detail::Bf16KernelTable::Tag;
  std::vector<std::pair<std::string, const detail::Bf16KernelTable*>> builds{{"base", &detail::isa::base(Tag{})}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    builds.emplace_back("avx2", &detail::isa::avx2(Tag{}));
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    builds.emplace_back("avx512", &detail::isa::avx512(Tag{}));
  }
#endif
  return builds;
}

void checkAgainstReference(std::vector<int64_t> lead, int64_t t, uint64_t seed, int64_t q = 0) {
  SCOPED_TRACE(testing::Message() << "t " << t << ", q " << q << ", " << lead.size() << " leading dims");
  const at::Tensor scores = scoresOf(lead, t, seed, q).requires_grad_(true);
  const at::Tensor gy = torch::randn(scores.sizes(), torch::kDouble).to(at::kBFloat16);
  const Reference ref = referenceOf(scores.detach(), gy);
  const at::Tensor y = detail::causalSoftmaxFused(scores);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  expectWithin(y, ref.y, kBf16Rel * ref.y.abs(), "values");
  // Past each query's position: exactly 0.
  const at::Tensor hidden = hiddenOf(q > 0 ? q : t, t);
  EXPECT_EQ(y.masked_select(hidden.expand(y.sizes())).abs().sum().item<double>(), 0.0);
  y.backward(gy);
  // gx = y (gy - sum(y gy)): the rounding of y and of the sum, each within
  // 2^-8 of its size, and of gx itself.
  const at::Tensor g = gy.to(torch::kDouble);
  const at::Tensor rowScale = (ref.y * g).abs().sum(-1, true) + g.abs();
  expectWithin(scores.grad(), ref.gx, kGradRel * (ref.gx.abs() + ref.y * rowScale) + 1e-30, "gradient");
}

TEST(CausalSoftmax, MatchesTheFloat64SoftmaxWithinBfloat16Rounding) {
  uint64_t seed = 1;
  for (int64_t t : {1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 64, 65, 127, 257}) {
    checkAgainstReference({2, 3}, t, seed++);
  }
  checkAgainstReference({}, 40, seed++);
  checkAgainstReference({1, 1, 1}, 96, seed++);
}

// Queries the last q of t positions: a block of queries against the keys
// up to its end.
TEST(CausalSoftmax, RectangularScoresOfTheLastQueries) {
  uint64_t seed = 50;
  for (const auto& [q, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 9}, {5, 40}, {31, 64}, {64, 256}}) {
    checkAgainstReference({2, 3}, t, seed++, q);
  }
}

// What the scores hold above the diagonal (the mask's -inf, a large value,
// NaN) changes nothing, values or gradient.
TEST(CausalSoftmax, ReadsNothingAboveTheDiagonal) {
  const int64_t t = 37;
  const at::Tensor masked = scoresOf({2, 2}, t, 11);
  const at::Tensor above = torch::ones({t, t}, torch::kBool).triu(1);
  const at::Tensor gy = torch::randn(masked.sizes()).to(at::kBFloat16);
  auto run = [&](const at::Tensor& scores) {
    const at::Tensor x = scores.clone().requires_grad_(true);
    const at::Tensor y = detail::causalSoftmaxFused(x);
    y.backward(gy);
    return std::pair{y.detach(), x.grad()};
  };
  const auto [y0, g0] = run(masked);
  for (double fill : {1e30, std::nan("")}) {
    SCOPED_TRACE(fill);
    const auto [y, g] = run(masked.masked_fill(above, fill));
    EXPECT_TRUE(torch::equal(y, y0));
    EXPECT_TRUE(torch::equal(g, g0));
  }
  // The gradient flowing in above the diagonal is not read either.
  const at::Tensor x = masked.clone().requires_grad_(true);
  detail::causalSoftmaxFused(x).backward(gy.masked_fill(above, std::nan("")));
  EXPECT_TRUE(torch::equal(x.grad(), g0));
}

TEST(CausalSoftmax, TakesNonContiguousScoresAndGradients) {
  const at::Tensor base = scoresOf({4, 3}, 33, 12);
  const at::Tensor strided = base.transpose(0, 1).requires_grad_(true);  // [3, 4, 33, 33], not contiguous
  ASSERT_FALSE(strided.is_contiguous());
  const at::Tensor gy = torch::randn({4, 3, 33, 33}).to(at::kBFloat16).transpose(0, 1);
  const at::Tensor dense = strided.detach().contiguous().requires_grad_(true);
  const at::Tensor a = detail::causalSoftmaxFused(strided), b = detail::causalSoftmaxFused(dense);
  EXPECT_TRUE(torch::equal(a, b));
  a.backward(gy);
  b.backward(gy.contiguous());
  EXPECT_TRUE(torch::equal(strided.grad(), dense.grad()));
}

TEST(CausalSoftmax, NoRowsAndNoGradients) {
  const at::Tensor empty = torch::zeros({0, 2, 5, 5}, at::kBFloat16);
  EXPECT_EQ(detail::causalSoftmaxFused(empty).sizes(), empty.sizes());
  // Without gradients: the values, and no autograd node.
  const at::Tensor scores = scoresOf({3}, 9, 13);
  const at::Tensor y = detail::causalSoftmaxFused(scores);
  EXPECT_FALSE(y.requires_grad());
  expectWithin(y, referenceOf(scores, torch::zeros_like(scores)).y, kBf16Rel * y.to(torch::kDouble).abs(),
               "values");
}

TEST(CausalSoftmax, OtherScoresTakeAtensSoftmax) {
  FusedOpsScope on(true);
  const int64_t before = fusedOpCalls();
  const at::Tensor f32 = scoresOf({2}, 8, 14).to(torch::kFloat);
  EXPECT_TRUE(torch::equal(causalSoftmax(f32), torch::softmax(f32, -1)));
  const at::Tensor wide = torch::randn({2, 5, 3}).to(at::kBFloat16);  // more queries than keys
  EXPECT_TRUE(torch::equal(causalSoftmax(wide), torch::softmax(wide, -1)));
  EXPECT_EQ(fusedOpCalls(), before);
  EXPECT_FALSE(detail::causalSoftmaxTakes(f32));
  EXPECT_THROW(detail::causalSoftmaxFused(f32), c10::Error);
  {
    FusedOpsScope off(false);
    const at::Tensor bf = scoresOf({2}, 8, 15);
    EXPECT_TRUE(torch::equal(causalSoftmax(bf), torch::softmax(bf, -1)));
    EXPECT_EQ(fusedOpCalls(), before);
  }
  const at::Tensor bf = scoresOf({2}, 8, 15);
  EXPECT_TRUE(torch::equal(causalSoftmax(bf), detail::causalSoftmaxFused(bf)));
  EXPECT_GT(fusedOpCalls(), before);
}

// Rows are independent: the same bits on 1 and 2 threads.
TEST(CausalSoftmax, ValuesAndGradientsDoNotDependOnTheThreadCount) {
  const at::Tensor scores = scoresOf({8, 4}, 64, 16);
  const at::Tensor gy = torch::randn(scores.sizes()).to(at::kBFloat16);
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    const at::Tensor x = scores.clone().requires_grad_(true);
    const at::Tensor y = detail::causalSoftmaxFused(x);
    y.backward(gy);
    return std::pair{y.detach(), x.grad()};
  };
  const int threads = at::get_num_threads();
  const auto one = run(1), two = run(2);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.first, two.first));
  EXPECT_TRUE(torch::equal(one.second, two.second));
}

// Each build this CPU runs against the baseline's: within one bfloat16
// rounding of each other (the sums of a row add in another order).
TEST(CausalSoftmax, EveryBuildGivesWhatTheBaselineGives) {
  const auto builds = bf16Builds();
  for (int64_t t : {1, 31, 33, 100}) {
    const at::Tensor x = scoresOf({3}, t, 17 + t), gy = torch::randn(x.sizes()).to(at::kBFloat16);
    const int64_t rows = 3 * t;
    auto run = [&](const detail::Bf16KernelTable& k) {
      at::Tensor y = torch::empty_like(x), gx = torch::empty_like(x);
      k.causalSoftmaxForward(x.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(), rows, t, t);
      k.causalSoftmaxBackward(y.data_ptr<c10::BFloat16>(), gy.data_ptr<c10::BFloat16>(), gx.data_ptr<c10::BFloat16>(),
                              rows, t, t);
      return std::pair{y.to(torch::kDouble), gx.to(torch::kDouble)};
    };
    const auto base = run(*builds[0].second);
    for (size_t b = 1; b < builds.size(); ++b) {
      SCOPED_TRACE(testing::Message() << builds[b].first << ", t " << t);
      const auto got = run(*builds[b].second);
      expectWithin(got.first, base.first, kBf16Rel * base.first.abs(), "values");
      const at::Tensor rowScale = base.second.abs().amax(-1, true) + 1e-30;
      expectWithin(got.second, base.second, kBf16Rel * rowScale, "gradient");
    }
  }
}

// --- GELU ---------------------------------------------------------------------

// h in bfloat16 (values in [-6, 6) and beyond), gelu and its gradient
// against float64's on the same values: y within one bfloat16 rounding plus
// float32's erf (|error| <= 1.5e-7 of the CDF, times |h|); the gradient
// gy * slope within the slope's and its own rounding.
void checkGelu(std::vector<int64_t> sizes, bool tanh, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << (tanh ? "tanh" : "erf") << ", " << c10::IntArrayRef(sizes));
  torch::manual_seed(seed);
  const at::Tensor h = (torch::randn(sizes, torch::kDouble) * 3).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor gy = torch::randn(sizes, torch::kDouble).to(at::kBFloat16);
  const at::Tensor hr = h.detach().to(torch::kDouble).requires_grad_(true);
  const at::Tensor want = torch::gelu(hr, tanh ? "tanh" : "none");
  want.backward(gy.to(torch::kDouble));
  const at::Tensor y = detail::geluBf16Fused(h, tanh);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const at::Tensor a = hr.detach().abs();
  expectWithin(y, want.detach(), kBf16Rel * want.detach().abs() + 2e-7 * (1 + a), "values");
  y.backward(gy);
  const at::Tensor g = gy.to(torch::kDouble).abs();
  expectWithin(h.grad(), hr.grad(), kGradRel * hr.grad().abs() + 4e-7 * g * (1 + a) + 1e-30, "gradient");
}

TEST(Bf16Gelu, MatchesTheFloat64GeluWithinBfloat16Rounding) {
  uint64_t seed = 30;
  for (bool tanh : {false, true}) {
    for (const auto& sizes : std::vector<std::vector<int64_t>>{{1}, {7}, {31}, {32}, {33}, {4097}, {3, 5, 17}}) {
      checkGelu(sizes, tanh, seed++);
    }
  }
}

TEST(Bf16Gelu, TakesNonContiguousInputAndNoGradients) {
  torch::manual_seed(40);
  const at::Tensor base = torch::randn({33, 20}).to(at::kBFloat16);
  const at::Tensor strided = base.t().requires_grad_(true);
  const at::Tensor dense = strided.detach().contiguous().requires_grad_(true);
  const at::Tensor a = detail::geluBf16Fused(strided, false), b = detail::geluBf16Fused(dense, false);
  EXPECT_TRUE(torch::equal(a, b));
  const at::Tensor gy = torch::randn({20, 33}).to(at::kBFloat16);
  a.backward(gy);
  b.backward(gy);
  EXPECT_TRUE(torch::equal(strided.grad(), dense.grad()));
  // Without gradients: the same values, no autograd node.
  const at::Tensor c = detail::geluBf16Fused(base.t(), false);
  EXPECT_FALSE(c.requires_grad());
  EXPECT_TRUE(torch::equal(c, a.detach()));
}

TEST(Bf16Gelu, ABiasOrAnotherDtypeTakesAtensGelu) {
  FusedOpsScope on(true);
  torch::manual_seed(41);
  const at::Tensor h = torch::randn({5, 9}).to(at::kBFloat16), b = torch::randn({9}).to(at::kBFloat16);
  const int64_t before = fusedOpCalls();
  EXPECT_FALSE(detail::geluBf16Takes(h, b));
  EXPECT_TRUE(torch::equal(biasGelu(h, b, false), torch::gelu(h + b)));
  EXPECT_FALSE(detail::geluBf16Takes(torch::randn({3}).to(at::kHalf), {}));
  EXPECT_THROW(detail::geluBf16Fused(torch::randn({3}), false), c10::Error);
  EXPECT_EQ(fusedOpCalls(), before);
  EXPECT_TRUE(torch::equal(biasGelu(h, {}, true), detail::geluBf16Fused(h, true)));
  EXPECT_GT(fusedOpCalls(), before);
  FusedOpsScope off(false);
  EXPECT_TRUE(torch::equal(biasGelu(h, {}, true), torch::gelu(h, "tanh")));
}

// Each build this CPU runs against the baseline's, within one rounding.
TEST(Bf16Gelu, EveryBuildGivesWhatTheBaselineGives) {
  torch::manual_seed(42);
  const int64_t n = 1000;  // tails at every vector width
  const at::Tensor h = (torch::randn({n}) * 4).to(at::kBFloat16), gy = torch::randn({n}).to(at::kBFloat16);
  for (bool tanh : {false, true}) {
    auto run = [&](const detail::Bf16KernelTable& k) {
      at::Tensor y = torch::empty_like(h), slope = torch::empty_like(h), gh = torch::empty_like(h);
      k.geluForward(h.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(), slope.data_ptr<c10::BFloat16>(), n,
                    tanh);
      k.geluBackward(gy.data_ptr<c10::BFloat16>(), slope.data_ptr<c10::BFloat16>(), gh.data_ptr<c10::BFloat16>(), n);
      return std::pair{y.to(torch::kDouble), gh.to(torch::kDouble)};
    };
    const auto builds = bf16Builds();
    const auto base = run(*builds[0].second);
    for (size_t b = 1; b < builds.size(); ++b) {
      SCOPED_TRACE(testing::Message() << builds[b].first << (tanh ? " tanh" : " erf"));
      const auto got = run(*builds[b].second);
      // Each within the float erf's error of float64 (checkGelu), so twice
      // that of each other.
      const at::Tensor a = 1 + h.to(torch::kDouble).abs(), g = gy.to(torch::kDouble).abs();
      expectWithin(got.first, base.first, kBf16Rel * base.first.abs() + 4e-7 * a, "values");
      expectWithin(got.second, base.second, kGradRel * base.second.abs() + 8e-7 * g * a, "gradient");
    }
  }
}

// A linear layer's bias on bfloat16 products (models/linear.h): every
// build adds as ATen's add_ and sums the rows in one order, so all give the
// baseline's bits, vector tails included.
TEST(Bf16Bias, EveryBuildGivesWhatTheBaselineGivesAndAtensAdd) {
  for (int64_t rows : {0, 1, 64, 131}) {
    for (int64_t n : {1, 15, 16, 17, 33, 384}) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " n " << n);
      torch::manual_seed(rows * 1000 + n);
      const at::Tensor y = torch::randn({rows, n}).to(at::kBFloat16), b = torch::randn({n});
      auto run = [&](const detail::Bf16KernelTable& k) {
        at::Tensor sum = y.clone(), cols = torch::full({n}, 7.0f);
        k.addToRows(sum.data_ptr<c10::BFloat16>(), b.data_ptr<float>(), rows, n);
        k.columnSums(y.data_ptr<c10::BFloat16>(), cols.data_ptr<float>(), rows, n);
        return std::pair{sum, cols};
      };
      const auto builds = bf16Builds();
      const auto base = run(*builds[0].second);
      EXPECT_TRUE(torch::equal(base.first, y.clone().add_(b)));
      EXPECT_LE((base.second.to(torch::kDouble) - y.to(torch::kDouble).sum(0)).abs().max().item<double>(),
                1e-6 * (1 + double(rows)));
      for (size_t k = 1; k < builds.size(); ++k) {
        SCOPED_TRACE(builds[k].first);
        const auto got = run(*builds[k].second);
        EXPECT_TRUE(torch::equal(got.first, base.first));
        EXPECT_TRUE(torch::equal(got.second, base.second));
      }
    }
  }
}

// --- attention in blocks of queries ---------------------------------------------

// q, k, v [B, H, T, D] -> out [B, T, H D] and the gradients of q, k, v for
// gy: causalAttention with the fused ops on or off, or in float64.
struct AttentionRun {
  at::Tensor out, dq, dk, dv;
};
AttentionRun attentionOf(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& gy,
                         bool fused, at::ScalarType dtype) {
  FusedOpsScope scope(fused);
  const at::Tensor q = q0.to(dtype).requires_grad_(true), k = k0.to(dtype).requires_grad_(true),
                   v = v0.to(dtype).requires_grad_(true);
  at::Tensor mask;
  at::Tensor out = dtype == torch::kDouble
                       ? [&] {
                           // The whole matrix in float64 (the reference; not the blockwise kernel).
                           const int64_t t = q.size(2), d = q.size(3);
                           const at::Tensor s = torch::matmul(q, k.transpose(2, 3)) / std::sqrt(double(d));
                           const at::Tensor p = torch::softmax(s.masked_fill(hiddenOf(t, t), -kInf), -1);
                           return torch::matmul(p, v).transpose(1, 2).reshape({q.size(0), t, -1});
                         }()
                       : causalAttention(q, k, v, mask, q.options());
  out.backward(gy.to(out.scalar_type()));
  return {out.detach().to(torch::kDouble), q.grad().to(torch::kDouble), k.grad().to(torch::kDouble),
          v.grad().to(torch::kDouble)};
}

// Blocks of queries (T past one block, the last one short) against the
// float64 whole matrix: no further from it than ATen's bfloat16 whole
// matrix is (twice its largest error, each of the output and gradients).
TEST(Bf16Ops, BlocksOfQueriesAreAsCloseToFloat64AsTheWholeMatrix) {
  for (int64_t t : {detail::kCausalQueryBlock + 1, 2 * detail::kCausalQueryBlock, 2 * detail::kCausalQueryBlock + 44}) {
    SCOPED_TRACE(t);
    torch::manual_seed(60 + t);
    const at::Tensor q = torch::randn({2, 3, t, 16}, torch::kDouble), k = torch::randn({2, 3, t, 16}, torch::kDouble);
    const at::Tensor v = torch::randn({2, 3, t, 16}, torch::kDouble), gy = torch::randn({2, t, 48}, torch::kDouble);
    ASSERT_TRUE(detail::causalBlocksApply(q.to(at::kBFloat16)));
    FusedOpsScope on(true);
    const int64_t before = fusedOpCalls();
    const AttentionRun blocks = attentionOf(q, k, v, gy, true, at::kBFloat16);
    EXPECT_EQ(fusedOpCalls() - before, (t + detail::kCausalQueryBlock - 1) / detail::kCausalQueryBlock);
    const AttentionRun whole = attentionOf(q, k, v, gy, false, at::kBFloat16);
    const AttentionRun ref = attentionOf(q, k, v, gy, false, torch::kDouble);
    auto worst = [](const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); };
    EXPECT_LE(worst(blocks.out, ref.out), 2 * worst(whole.out, ref.out)) << worst(whole.out, ref.out);
    EXPECT_LE(worst(blocks.dq, ref.dq), 2 * worst(whole.dq, ref.dq)) << worst(whole.dq, ref.dq);
    EXPECT_LE(worst(blocks.dk, ref.dk), 2 * worst(whole.dk, ref.dk)) << worst(whole.dk, ref.dk);
    EXPECT_LE(worst(blocks.dv, ref.dv), 2 * worst(whole.dv, ref.dv)) << worst(whole.dv, ref.dv);
  }
  // One block or less, float32, or fused ops off: the whole matrix (or the blockwise kernel).
  EXPECT_FALSE(detail::causalBlocksApply(torch::zeros({1, 1, detail::kCausalQueryBlock, 4}, at::kBFloat16)));
  EXPECT_FALSE(detail::causalBlocksApply(torch::zeros({1, 1, 300, 4})));
  FusedOpsScope off(false);
  EXPECT_FALSE(detail::causalBlocksApply(torch::zeros({1, 1, 300, 4}, at::kBFloat16)));
}

// --- the model ------------------------------------------------------------------

// A GPT under bfloat16 autocast takes the fused softmax, GELU and the
// residual add + LayerNorm (a float32 stream, a bfloat16 branch) once per
// block each and trains as with ATen's ops, to bfloat16's rounding.
TEST(Bf16Ops, AGptUnderBf16AutocastTakesThem) {
  GptOptions o;
  o.vocabSize = 13;
  o.blockSize = 24;
  o.nLayer = 2;
  o.nHead = 2;
  o.nEmbd = 32;
  o.dropout = 0;
  torch::manual_seed(18);
  std::shared_ptr<Model> m = createGpt(o);
  m->train();
  const at::Tensor tokens = torch::randint(13, {3, 24}, torch::kLong);
  auto step = [&](bool fused) {
    FusedOpsScope scope(fused);
    m->zero_grad();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    const int64_t before = fusedOpCalls();
    const at::Tensor logits = m->forward(tokens);
    const int64_t calls = fusedOpCalls() - before;
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
    const at::Tensor loss = logits.to(torch::kFloat).pow(2).mean();
    loss.backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : m->parameters()) grads.push_back(p.grad().clone());
    return std::tuple{calls, loss.item<double>(), grads};
  };
  const auto [fusedCalls, fusedLoss, fusedGrads] = step(true);
  const auto [plainCalls, plainLoss, plainGrads] = step(false);
  EXPECT_EQ(fusedCalls, 3 * o.nLayer);
  EXPECT_EQ(plainCalls, 0);
  EXPECT_NEAR(fusedLoss, plainLoss, 2e-2 * std::abs(plainLoss));
  ASSERT_EQ(fusedGrads.size(), plainGrads.size());
  for (size_t k = 0; k < fusedGrads.size(); ++k) {
    const double scale = plainGrads[k].abs().max().item<double>() + 1e-12;
    EXPECT_LE((fusedGrads[k] - plainGrads[k]).abs().max().item<double>(), 5e-2 * scale) << k;
  }
}

}  // namespace
}  // namespace cohort::models
