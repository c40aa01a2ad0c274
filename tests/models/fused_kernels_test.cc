// The builds of the fused ops' loops per instruction set
// (models/fused_kernels.h): every build this CPU runs gives what the
// baseline build gives, on sizes that leave vector tails (1, primes) and
// rows that fill several blocks; and the calls take the widest build, or the
// one ATEN_CPU_CAPABILITY holds LibTorch to (the `/avx2` run holds it to AVX2).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "models/fused_kernels.h"

namespace cohort::models::detail {
namespace {

template <typename T>
struct Build {
  std::string name;
  const FusedKernelTable<T>* table;
};

// The builds this CPU can run, the baseline first.
template <typename T>
std::vector<Build<T>> buildsHere() {
  std::vector<Build<T>> builds{{"base", &isa::base(T{})}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) builds.push_back({"avx2", &isa::avx2(T{})});
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    builds.push_back({"avx512", &isa::avx512(T{})});
  }
#endif
  return builds;
}

template <typename T>
std::vector<T> values(int64_t count, double scale, uint64_t seed) {
  torch::manual_seed(seed);
  const at::Tensor t = (torch::randn({count}, torch::kDouble) * scale).to(c10::CppTypeToScalarType<T>::value);
  return std::vector<T>(t.data_ptr<T>(), t.data_ptr<T>() + count);
}

// Relative to 1 + |want|: 1e-12 in double, 2e-6 in float for values
// computed element by element. A value summed over `terms` others (a
// bias's or weight's gradient over the rows, BatchNorm's statistics over a
// channel) may round differently in each build, in a different order of
// additions and with or without fused multiply-adds: 2 float roundings per
// term more (131 rows: 3.4e-5). LayerNorm's gradients over rows of width 1
// in float get 1e-4 (`loose`: the centred value is rounding noise, and
// rstd = 1/sqrt(eps) = 316 scales one rounding of it, 6e-8, to 2e-5).
template <typename T>
void expectNear(const std::vector<T>& got, const std::vector<T>& want, const std::string& what, int64_t terms = 1,
                bool loose = false) {
  const double floatTol = loose ? 1e-4 : 2e-6 + 2 * 1.2e-7 * double(terms - 1);
  const double tol = sizeof(T) == 8 ? 1e-12 : floatTol;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    ASSERT_LE(std::abs(g - w), tol * (1 + std::abs(w))) << what << " [" << i << "]: " << g << " vs " << w;
  }
}

// Each kernel on the same inputs through every build; outputs compared
// with the baseline's.
template <typename T>
void checkEveryBuild(int64_t rows, int64_t n) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " n " << n << (sizeof(T) == 8 ? " double" : " float"));
  const auto builds = buildsHere<T>();
  const int64_t size = rows * n;
  const std::vector<T> x = values<T>(size, 2.0, 1), d = values<T>(size, 1.0, 2), g = values<T>(size, 1.0, 3);
  const std::vector<T> w = values<T>(n, 1.0, 4), b = values<T>(n, 0.5, 5);
  struct Out {
    std::vector<T> y, gh, gb, s, ln, mean, rstd, gx, gw, gb2;
    std::vector<T> slope = {}, yTanh = {}, slopeTanh = {}, sums = {}, plusBias = {};
  };
  std::vector<Out> outs;
  for (const Build<T>& build : builds) {
    const FusedKernelTable<T>& k = *build.table;
    Out o{std::vector<T>(size), std::vector<T>(size), std::vector<T>(n), std::vector<T>(size), std::vector<T>(size),
          std::vector<T>(rows), std::vector<T>(rows), std::vector<T>(size), std::vector<T>(n), std::vector<T>(n)};
    o.slope.resize(size);
    o.yTanh.resize(size);
    o.slopeTanh.resize(size);
    k.biasGeluForward(x.data(), b.data(), o.y.data(), o.slope.data(), rows, n, /*tanh=*/false);
    k.biasGeluForward(x.data(), nullptr, o.yTanh.data(), o.slopeTanh.data(), rows, n, /*tanh=*/true);
    // The exact GELU's slope: the tanh form's, far into the negative tail,
    // is 1 - t^2 of a t one rounding from -1 (up to 1.5e-6 apart between
    // libm's tanh and SLEEF's), which gy would scale past the bound.
    k.biasGeluBackward(g.data(), o.slope.data(), o.gh.data(), o.gb.data(), rows, n);
    k.addLayerNormForward(x.data(), d.data(), w.data(), b.data(), o.s.data(), o.ln.data(), o.mean.data(),
                          o.rstd.data(), rows, n, 1e-5);
    k.addLayerNormBackward(d.data(), g.data(), o.s.data(), o.mean.data(), o.rstd.data(), w.data(), o.gx.data(),
                           o.gw.data(), o.gb2.data(), rows, n);
    o.sums.resize(n);
    k.columnSums(g.data(), o.sums.data(), rows, n);
    o.plusBias = x;
    k.addToRows(o.plusBias.data(), b.data(), rows, n);
    outs.push_back(std::move(o));
  }
  for (size_t i = 1; i < builds.size(); ++i) {
    const std::string& name = builds[i].name;
    expectNear(outs[i].y, outs[0].y, name + " bias+gelu");
    expectNear(outs[i].slope, outs[0].slope, name + " bias+gelu slope");
    expectNear(outs[i].yTanh, outs[0].yTanh, name + " gelu (tanh)");
    expectNear(outs[i].slopeTanh, outs[0].slopeTanh, name + " gelu (tanh) slope");
    expectNear(outs[i].gh, outs[0].gh, name + " bias+gelu dh");
    expectNear(outs[i].gb, outs[0].gb, name + " bias+gelu db", rows);
    expectNear(outs[i].ln, outs[0].ln, name + " add+layernorm", n);
    expectNear(outs[i].gx, outs[0].gx, name + " add+layernorm dx", n, n == 1);
    expectNear(outs[i].gw, outs[0].gw, name + " add+layernorm dw", rows, n == 1);
    expectNear(outs[i].sums, outs[0].sums, name + " column sums", rows);
    EXPECT_EQ(outs[i].plusBias, outs[0].plusBias) << name << " bias added to rows";
  }
}

// BatchNorm + ReLU in both layouts through every build.
template <typename T>
void checkEveryBuildBatchNorm(BnShape sh) {
  SCOPED_TRACE(testing::Message() << "n " << sh.n << " c " << sh.c << " hw " << sh.hw
                                  << (sh.channelsLast ? " channels-last" : "") << (sizeof(T) == 8 ? " double" : ""));
  const auto builds = buildsHere<T>();
  const int64_t size = sh.n * sh.c * sh.hw;
  const std::vector<T> x = values<T>(size, 2.0, 6), gy = values<T>(size, 1.0, 7);
  const std::vector<T> scale = values<T>(sh.c, 1.0, 8), shift = values<T>(sh.c, 0.5, 9);
  std::vector<std::vector<T>> outs;
  for (const Build<T>& build : builds) {
    const FusedKernelTable<T>& k = *build.table;
    std::vector<T> mean(sh.c), var(sh.c), y(size), gx(size), gw(sh.c), gb(sh.c), invstd(sh.c);
    k.batchNormStats(x.data(), sh, mean.data(), var.data());
    for (int64_t c = 0; c < sh.c; ++c) invstd[c] = static_cast<T>(1 / std::sqrt(var[c] + 1e-5));
    k.batchNormReluForward(x.data(), scale.data(), shift.data(), y.data(), sh);
    k.batchNormReluBackward(gy.data(), x.data(), mean.data(), invstd.data(), scale.data(), shift.data(), gx.data(),
                            gw.data(), gb.data(), sh);
    std::vector<T> all;
    for (const auto* part : {&mean, &var, &y, &gx, &gw, &gb}) all.insert(all.end(), part->begin(), part->end());
    outs.push_back(std::move(all));
  }
  // Statistics and the backward's sums go over a channel's n * hw values.
  for (size_t i = 1; i < builds.size(); ++i) {
    expectNear(outs[i], outs[0], builds[i].name + " batchnorm+relu", sh.n * sh.hw);
  }
}

// A linear layer's bias (models/detail/weight_product.h): added to every row
// as ATen's add_ adds it, bitwise; its gradient, the column sums, within
// float rounding of ATen's sum in double, over more rows than one block.
TEST(FusedKernels, ALinearLayersBiasAddsAsAtenAndSumsItsGradient) {
  for (int64_t rows : {0, 1, 63, 64, 65, 1000}) {
    for (int64_t n : {1, 17, 384}) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " n " << n);
      torch::manual_seed(rows * 1000 + n);
      const at::Tensor y = torch::randn({rows, n}), b = torch::randn({n}), g = torch::randn({rows, n});
      at::Tensor ours = y.clone();
      addToRows<float>(ours.data_ptr<float>(), b.data_ptr<float>(), rows, n);
      EXPECT_TRUE(torch::equal(ours, y + b));
      at::Tensor sums = torch::full({n}, 7.0f);
      columnSums<float>(g.data_ptr<float>(), sums.data_ptr<float>(), rows, n);
      const at::Tensor want = g.to(torch::kDouble).sum(0);
      const double bound = 1e-6 * (1 + double(rows));
      EXPECT_LE((sums.to(torch::kDouble) - want).abs().max().item<double>(), bound);
      at::Tensor sumsD = torch::full({n}, 7.0, torch::kDouble);
      const at::Tensor gd = g.to(torch::kDouble);
      columnSums<double>(gd.data_ptr<double>(), sumsD.data_ptr<double>(), rows, n);
      EXPECT_LE((sumsD - want).abs().max().item<double>(), 1e-12 * (1 + double(rows)));
    }
  }
}

TEST(FusedKernels, EveryBuildThisCpuRunsAgreesWithTheBaseline) {
  ASSERT_GE(buildsHere<float>().size(), 1u);
  for (int64_t rows : {1, 7, 131}) {
    for (int64_t n : {1, 7, 16, 31, 257}) {
      checkEveryBuild<float>(rows, n);
      checkEveryBuild<double>(rows, n);
    }
  }
  for (bool last : {false, true}) {
    for (BnShape sh : {BnShape{2, 3, 5}, BnShape{4, 17, 9}, BnShape{3, 64, 49}}) {
      sh.channelsLast = last;
      checkEveryBuildBatchNorm<float>(sh);
      checkEveryBuildBatchNorm<double>(sh);
    }
  }
}

// The calls take the widest build the CPU runs, or the one
// ATEN_CPU_CAPABILITY holds LibTorch to (AVX2 in the test's /avx2 run).
TEST(FusedKernels, TheCallsTakeTheWidestBuildOrTheOneLibTorchIsHeldTo) {
  const std::string chosen = fusedKernelsIsa();
  const char* held = std::getenv("ATEN_CPU_CAPABILITY");
  if (held != nullptr && std::string(held) == "avx2") {
    EXPECT_EQ(chosen, "avx2");
    return;
  }
  if (held != nullptr && std::string(held) == "default") {
    EXPECT_EQ(chosen, "base");
    return;
  }
  EXPECT_EQ(chosen, buildsHere<float>().back().name);
}

}  // namespace
}  // namespace cohort::models::detail
