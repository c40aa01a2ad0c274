// The blockwise attention's products and transposes (models/fused_kernels.h,
// AttentionKernelTable) in every build this CPU runs (AVX2, AVX-512): against the
// same product summed in double, on sizes around the vector widths (8, 16)
// and the kernels' tiles (6, 4, 8, 12 and 16 rows), A read row-wise and
// transposed, beta 0 (C never read: it holds NaN), 1 and 0.5; transposes
// exactly, edges included; and the table the calls take.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "models/fused_kernels.h"

namespace cohort::models::detail {
namespace {

struct AttentionBuild {
  std::string name;
  const AttentionKernelTable* table;
};

std::vector<AttentionBuild> attentionBuildsHere() {
  std::vector<AttentionBuild> builds;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    builds.push_back({"avx2", &isa::avx2(AttentionKernelTable::Tag{})});
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    builds.push_back({"avx512", &isa::avx512(AttentionKernelTable::Tag{})});
  }
#endif
  return builds;
}

std::vector<float> randomFloats(size_t n, std::mt19937& gen) {
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

TEST(AttentionKernels, EveryBuildsProductEqualsTheSumInDouble) {
  const auto builds = attentionBuildsHere();
  if (builds.empty()) GTEST_SKIP() << "this CPU has neither AVX2 with FMA nor AVX-512";
  std::mt19937 gen(7);
  const std::vector<int64_t> sizes = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65};
  for (const AttentionBuild& build : builds) {
    int cases = 0;
    for (int64_t m : {1, 5, 6, 7, 12, 13, 16, 17, 64}) {
      for (int64_t n : sizes) {
        for (int64_t k : {1, 2, 32, 65}) {
          for (bool transposed : {false, true}) {
            for (float beta : {0.f, 1.f, 0.5f}) {
              // A is m x k, stored [m][k + 3] or, transposed, [k][m + 5];
              // B's rows n + 2 apart, C's n + 1.
              const int64_t lda = transposed ? m + 5 : k + 3, ldb = n + 2, ldc = n + 1;
              const std::vector<float> a = randomFloats((transposed ? k : m) * lda, gen);
              const std::vector<float> b = randomFloats(k * ldb, gen);
              std::vector<float> c = randomFloats(m * ldc, gen);
              const std::vector<float> before = c;
              if (beta == 0.f) {
                for (int64_t i = 0; i < m; ++i) {
                  for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
                }
              }
              const int64_t ars = transposed ? 1 : lda, acs = transposed ? lda : 1;
              const float alpha = 0.75f;
              build.table->product(m, n, k, alpha, a.data(), ars, acs, b.data(), ldb, beta, c.data(), ldc);
              for (int64_t i = 0; i < m; ++i) {
                for (int64_t j = 0; j < ldc; ++j) {
                  if (j >= n) {
                    // Between the rows: not C's, never written.
                    ASSERT_EQ(c[i * ldc + j], before[i * ldc + j]) << build.name << " wrote past column " << n;
                    continue;
                  }
                  double sum = 0, size = 0;
                  for (int64_t p = 0; p < k; ++p) {
                    const double term = double(a[i * ars + p * acs]) * b[p * ldb + j];
                    sum += term;
                    size += std::fabs(term);
                  }
                  const double want = alpha * sum + (beta == 0.f ? 0.0 : double(beta) * before[i * ldc + j]);
                  // A float sum of k terms: k roundings of at most the
                  // terms' magnitude each, plus the scaling's.
                  const double tol = 1.2e-7 * (double(k) + 2) * (alpha * size + std::fabs(before[i * ldc + j])) + 1e-30;
                  ASSERT_NEAR(c[i * ldc + j], want, tol)
                      << build.name << ": m " << m << " n " << n << " k " << k << (transposed ? " A^T" : "")
                      << " beta " << beta << " at (" << i << ", " << j << ")";
                }
              }
              ++cases;
            }
          }
        }
      }
    }
    EXPECT_EQ(cases, 9 * 12 * 4 * 2 * 3) << build.name;
  }
}

TEST(AttentionKernels, EveryBuildTransposesExactlyEdgesIncluded) {
  const auto builds = attentionBuildsHere();
  if (builds.empty()) GTEST_SKIP() << "this CPU has neither AVX2 with FMA nor AVX-512";
  std::mt19937 gen(8);
  for (const AttentionBuild& build : builds) {
    for (int64_t rows : {1, 7, 8, 9, 16, 37, 64}) {
      for (int64_t cols : {1, 5, 8, 13, 32, 33}) {
        const int64_t ldx = cols + 4, ldy = rows + 3;
        const std::vector<float> x = randomFloats(rows * ldx, gen);
        std::vector<float> y(cols * ldy, -1.f);
        build.table->transpose(x.data(), ldx, rows, cols, y.data(), ldy);
        for (int64_t c = 0; c < cols; ++c) {
          for (int64_t r = 0; r < ldy; ++r) {
            const float want = r < rows ? x[r * ldx + c] : -1.f;
            ASSERT_EQ(y[c * ldy + r], want) << build.name << " " << rows << " x " << cols << " at (" << r << ", " << c << ")";
          }
        }
      }
    }
  }
}

// The attention takes the widest build, the one ATEN_CPU_CAPABILITY holds
// LibTorch's kernels to, or none (BLAS) at the baseline.
TEST(AttentionKernels, TheCallsTakeTheBuildTheFusedOpsTake) {
  const std::string isa = fusedKernelsIsa();
  const AttentionKernelTable* taken = attentionKernels();
  if (isa == "base") {
    EXPECT_EQ(taken, nullptr);
    return;
  }
#if defined(__x86_64__)
  EXPECT_EQ(taken, isa == "avx512" ? &isa::avx512(AttentionKernelTable::Tag{}) : &isa::avx2(AttentionKernelTable::Tag{}));
#endif
  const char* held = std::getenv("ATEN_CPU_CAPABILITY");
  if (held != nullptr && std::string(held) == "avx2") {
    EXPECT_EQ(isa, "avx2");
  }
}

}  // namespace
}  // namespace cohort::models::detail
