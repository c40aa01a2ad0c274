// Gradient accumulation: k micro-steps of batch b are one step of batch k*b,
// in one process and across ranks.

#include <gtest/gtest.h>

#include "util/jobs.h"
#include "util/runs.h"

namespace cohort {
namespace {

std::vector<std::string> run(int batch, int accumulate) {
  return {"training.max_steps=5", "training.batch_size=" + std::to_string(batch),
          "training.accumulate_steps=" + std::to_string(accumulate)};
}

TEST(Accumulation, TwoMicroStepsOfBEqualOneStepOf2B) {
  test::TempDir dir;
  auto big = test::trainTiny(dir, "big", 1, run(8, 1));
  auto accumulated = test::trainTiny(dir, "acc", 1, run(4, 2));
  EXPECT_LT(test::maxDifference(big, accumulated), 1e-5);
  auto small = test::trainTiny(dir, "small", 1, run(4, 1));
  EXPECT_GT(test::maxDifference(big, small), 1e-3) << "the comparison cannot tell batches apart";
}

TEST(Accumulation, AcrossRanks) {
  test::TempDir dir;
  auto big = test::trainTiny(dir, "big", 2, run(8, 1));
  auto accumulated = test::trainTiny(dir, "acc", 2, run(4, 2));
  EXPECT_LT(test::maxDifference(big, accumulated), 1e-5);
  // Inner micro-steps exchanged nothing: 5 optimizer steps, 5 exchanges.
  const std::string log = test::readText(dir.file("acc/logs/rank-1.log"));
  EXPECT_NE(log.find("gradient exchanges: 5;"), std::string::npos) << log;
}

}  // namespace
}  // namespace cohort
