#pragma once

// A float32 result against its float64 reference, to the rounding of a sum:
// a float32 sum of n products is within about n eps of the exact sum of
// their magnitudes (the classic bound gamma_n). `scale` is that magnitude
// in float64 (|x| |W|^T + |b| for a linear layer) and the bound here
// (2 n + 1) eps of it.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

namespace cohort::test {

inline void expectWithinSumRounding(const at::Tensor& got, const at::Tensor& want, const at::Tensor& scale,
                                    int64_t n, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double eps = std::numeric_limits<float>::epsilon();
  const at::Tensor diff = (got.detach().to(at::kDouble) - want.detach()).abs();
  const at::Tensor bound = (2.0 * double(std::max<int64_t>(n, 1)) + 1.0) * eps * scale + 1e-30;
  EXPECT_TRUE(diff.numel() == 0 || (diff <= bound).all().item<bool>())
      << what << ": largest difference " << (diff.numel() ? diff.max().item<double>() : 0.0) << ", n " << n;
}

}  // namespace cohort::test
