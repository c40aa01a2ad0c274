// Gradient accumulation: k micro-steps of batch b are one step of batch k*b,
// in one process and across ranks.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/ckpt/state_dict.h"
#include "util/jobs.h"

namespace cohort {
namespace {

ckpt::StateDict train(const test::TempDir& dir, const std::string& tag, int procs, int batch,
                      int accumulate) {
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("accum"));
  auto r = test::cohort({"run", job, "--procs", std::to_string(procs), "--run-dir", dir.file(tag),
                         "--set", "training.max_steps=5", "--set",
                         "training.batch_size=" + std::to_string(batch), "--set",
                         "training.accumulate_steps=" + std::to_string(accumulate)});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  return ckpt::readStateDict(dir.file(tag + "/model/final.pt"));
}

double maxDifference(const ckpt::StateDict& a, const ckpt::StateDict& b) {
  double m = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    m = std::max(m, (a[k].second - b[k].second).abs().max().item<double>());
  }
  return m;
}

TEST(Accumulation, TwoMicroStepsOfBEqualOneStepOf2B) {
  test::TempDir dir;
  auto big = train(dir, "big", 1, 8, 1);
  auto accumulated = train(dir, "acc", 1, 4, 2);
  EXPECT_LT(maxDifference(big, accumulated), 1e-5);
  auto small = train(dir, "small", 1, 4, 1);
  EXPECT_GT(maxDifference(big, small), 1e-3) << "the comparison cannot tell batches apart";
}

TEST(Accumulation, AcrossRanks) {
  test::TempDir dir;
  auto big = train(dir, "big", 2, 8, 1);
  auto accumulated = train(dir, "acc", 2, 4, 2);
  EXPECT_LT(maxDifference(big, accumulated), 1e-5);
  // Inner micro-steps exchanged nothing: 5 optimizer steps, 5 exchanges.
  const std::string log = test::readText(dir.file("acc/logs/rank-1.log"));
  EXPECT_NE(log.find("gradient exchanges: 5;"), std::string::npos) << log;
}

}  // namespace
}  // namespace cohort
