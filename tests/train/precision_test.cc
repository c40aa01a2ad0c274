// training.precision (train/precision.h): what auto picks, what the
// autocast scope does to LibTorch's state, and a short run in bf16 against
// the same run in fp32.

#include "cohort/train/precision.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "util/jobs.h"
#include "util/runs.h"

namespace cohort {
namespace {

TEST(Precision, AutoFollowsTheCpusBf16Instructions) {
  using train::resolvePrecision;
  EXPECT_EQ(resolvePrecision(Precision::automatic, {"x", {"avx2", "avx512f", "avx512_bf16"}}).precision,
            Precision::bf16);
  EXPECT_EQ(resolvePrecision(Precision::automatic, {"x", {"avx2", "amx_bf16"}}).precision, Precision::bf16);
  const auto none = resolvePrecision(Precision::automatic, {"x", {"avx2", "fma", "avx512f"}});
  EXPECT_EQ(none.precision, Precision::fp32);
  EXPECT_NE(none.reason.find("neither avx512_bf16 nor amx_bf16"), std::string::npos) << none.reason;
  // A setting is kept whatever the CPU has.
  EXPECT_EQ(resolvePrecision(Precision::fp32, {"x", {"avx512_bf16"}}).precision, Precision::fp32);
  EXPECT_EQ(resolvePrecision(Precision::bf16, {"x", {}}).precision, Precision::bf16);
}

TEST(Precision, TheScopeAutocastsMatrixProductsAndRestoresTheState) {
  const at::Tensor x = torch::randn({4, 8});
  const at::Tensor w = torch::randn({3, 8});
  ASSERT_FALSE(at::autocast::is_cpu_enabled());
  {
    train::AutocastScope bf16(Precision::bf16, c10::Device(c10::kCPU));
    EXPECT_TRUE(at::autocast::is_cpu_enabled());
    EXPECT_EQ(torch::linear(x, w).scalar_type(), at::kBFloat16);
    {
      train::AutocastScope inner(Precision::bf16, c10::Device(c10::kCPU));
      EXPECT_EQ(torch::matmul(x, w.t()).scalar_type(), at::kBFloat16);
    }
    EXPECT_TRUE(at::autocast::is_cpu_enabled()) << "an inner scope turned the outer one off";
    // Reductions stay float32 under autocast.
    EXPECT_EQ(torch::softmax(x, 1).scalar_type(), at::kFloat);
  }
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_EQ(torch::linear(x, w).scalar_type(), at::kFloat);
  {
    train::AutocastScope fp32(Precision::fp32, c10::Device(c10::kCPU));
    EXPECT_FALSE(at::autocast::is_cpu_enabled());
    EXPECT_EQ(torch::linear(x, w).scalar_type(), at::kFloat);
  }
}

std::vector<double> trainLosses(const std::string& run) {
  std::vector<double> losses;
  for (const auto& j : test::readJsonLines(run + "/metrics.jsonl")) {
    if (j["event"] == "train") losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

TEST(Precision, Bf16FollowsTheFp32LearningCurve) {
  // The same 2-rank run (3 epochs of the tiny job, a loss every step) in
  // fp32 and in bf16: bf16 takes other numbers (the curves are not equal),
  // and the mean loss of the last epoch is within 5% of fp32's.
  test::TempDir dir;
  const std::vector<std::string> common{"training.epochs=3", "data.eval.kind=none"};
  auto with = [&](const char* precision) {
    std::vector<std::string> o = common;
    o.push_back(std::string("training.precision=") + precision);
    return o;
  };
  const auto fp32 = test::trainTiny(dir, "fp32", 2, with("fp32"));
  const auto bf16 = test::trainTiny(dir, "bf16", 2, with("bf16"));
  const std::vector<double> a = trainLosses(dir.file("fp32")), b = trainLosses(dir.file("bf16"));
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GE(a.size(), 9u);
  EXPECT_NE(a, b) << "bf16 trained exactly as fp32: autocast did not take effect";
  const size_t lastEpoch = a.size() / 3;
  double meanA = 0, meanB = 0;
  for (size_t i = a.size() - lastEpoch; i < a.size(); ++i) {
    meanA += a[i] / lastEpoch;
    meanB += b[i] / lastEpoch;
  }
  EXPECT_LT(meanA, a.front()) << "the fp32 run did not learn: the comparison says nothing";
  EXPECT_NEAR(meanB, meanA, 0.05 * meanA) << "bf16 " << meanB << ", fp32 " << meanA;
  EXPECT_LT(test::maxDifference(fp32, bf16), 0.05);
  const std::string log = test::readText(dir.file("bf16/logs/rank-1.log"));
  EXPECT_NE(log.find("precision bf16 (training.precision: bf16)"), std::string::npos) << log;
}

}  // namespace
}  // namespace cohort
