// The blockwise attention's products and transposes (models/fused_kernels.h,
// AttentionKernelTable) in every build this CPU runs (AVX2, AVX-512): against the
// same product summed in double, on sizes around the vector widths (8, 16)
// and the kernels' tiles (6, 4, 8, 12 and 16 rows), A read row-wise and
// transposed, beta 0 (C never read: it holds NaN), 1 and 0.5; transposes
// exactly, edges included; the softmax's block steps against the same
// steps in double, with the causal mask cutting rows anywhere (none, some,
// all of a row's values kept); and the table the calls take.

#include <gtest/gtest.h>

#include <algorithm>
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

// exp(arg) in float: 2 ulp of the row kernels' exp, and the rounding of
// the shifted argument (half an ulp of |arg|, relative in the result).
double expTolerance(double want, double arg) { return want == 0 ? 1e-38 : want * (2.4e-7 + 6e-8 * std::fabs(arg)) + 1e-38; }

// A row's values kept under the causal mask (attention_kernels_impl.h).
int64_t keptOf(int64_t r, int64_t diag, int64_t cols) { return std::clamp<int64_t>(diag + r + 1, 0, cols); }

TEST(AttentionKernels, EveryBuildsSoftmaxStepsEqualThemInDouble) {
  const auto builds = attentionBuildsHere();
  if (builds.empty()) GTEST_SKIP() << "this CPU has neither AVX2 with FMA nor AVX-512";
  std::mt19937 gen(9);
  for (const AttentionBuild& build : builds) {
    for (int64_t rows : {1, 7, 64}) {
      for (int64_t cols : {1, 9, 16, 33, 64}) {
        for (int64_t diag : {-3, 0, 5, 64}) {
          const std::string where = build.name + ": " + std::to_string(rows) + " x " + std::to_string(cols) +
                                    " diag " + std::to_string(diag);
          const int64_t ld = cols + 3, nd = 13;
          // The forward's step, twice: from the first block (m = -inf) and
          // then from the running values it left.
          std::vector<float> m(rows, -std::numeric_limits<float>::infinity()), l(rows, 0.f);
          std::vector<float> acc = randomFloats(rows * nd, gen);
          std::vector<double> wantM(m.begin(), m.end()), wantL(rows, 0.0), wantAcc(acc.begin(), acc.end());
          for (int pass = 0; pass < 2; ++pass) {
            std::vector<float> s = randomFloats(rows * ld, gen);
            for (float& x : s) x *= 4;
            const std::vector<float> in = s;
            build.table->softmaxBlock(s.data(), ld, rows, cols, diag, m.data(), l.data(), acc.data(), nd);
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t kept = keptOf(r, diag, cols);
              double mx = wantM[r];
              for (int64_t j = 0; j < kept; ++j) mx = std::max(mx, double(in[r * ld + j]));
              double sum = 0;
              for (int64_t j = 0; j < cols; ++j) {
                const double arg = double(in[r * ld + j]) - mx;
                const double want = j < kept ? std::exp(arg) : 0.0;
                sum += want;
                ASSERT_NEAR(s[r * ld + j], want, expTolerance(want, arg)) << where << " pass " << pass << " (" << r
                                                                           << ", " << j << ")";
              }
              for (int64_t j = cols; j < ld; ++j) ASSERT_EQ(s[r * ld + j], in[r * ld + j]) << where << ": wrote past the block";
              const double correction = wantM[r] == mx ? 1.0 : std::exp(wantM[r] - mx);
              for (int64_t j = 0; j < nd; ++j) {
                wantAcc[r * nd + j] *= correction;
                ASSERT_NEAR(acc[r * nd + j], wantAcc[r * nd + j], 1e-6 * (1 + std::fabs(wantAcc[r * nd + j]))) << where;
                wantAcc[r * nd + j] = acc[r * nd + j];
              }
              wantL[r] = wantL[r] * correction + sum;
              ASSERT_NEAR(l[r], wantL[r], 1e-6 * (1 + wantL[r])) << where << " row " << r;
              wantL[r] = l[r];
              wantM[r] = mx;
              ASSERT_EQ(m[r], float(mx)) << where << " row " << r;
            }
          }
          // The backward's probabilities and their gradient.
          std::vector<float> p = randomFloats(rows * ld, gen), shift = randomFloats(rows, gen);
          for (float& x : shift) x = std::fabs(x) * 4 + 4;  // at or above the scores, as a logsumexp is
          const std::vector<float> scores = p;
          build.table->expBlock(p.data(), ld, rows, cols, diag, shift.data());
          std::vector<float> ds = randomFloats(rows * ld, gen), d = randomFloats(rows, gen);
          const std::vector<float> dp = ds;
          build.table->scoreGradBlock(ds.data(), p.data(), ld, rows, cols, d.data());
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t kept = keptOf(r, diag, cols);
            for (int64_t j = 0; j < ld; ++j) {
              const int64_t at = r * ld + j;
              if (j >= cols) {
                ASSERT_EQ(p[at], scores[at]) << where << ": wrote past the block";
                ASSERT_EQ(ds[at], dp[at]) << where << ": wrote past the block";
                continue;
              }
              const double arg = double(scores[at]) - shift[r];
              const double want = j < kept ? std::exp(arg) : 0.0;
              ASSERT_NEAR(p[at], want, expTolerance(want, arg)) << where << " (" << r << ", " << j << ")";
              const double grad = double(p[at]) * (double(dp[at]) - d[r]);
              ASSERT_NEAR(ds[at], grad, 2.4e-7 * std::fabs(p[at]) * (std::fabs(dp[at]) + std::fabs(d[r])) + 1e-38)
                  << where << " (" << r << ", " << j << ")";
            }
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
