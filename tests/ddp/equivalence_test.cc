// Reference test of the DDP engine with real processes: after k steps, N ranks
// with batch b each hold the same parameters as one process with batch N*b
// (model without BatchNorm or dropout), whatever the bucket layout.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <map>

#include "cohort/ckpt/state_dict.h"
#include "util/jobs.h"

namespace cohort {
namespace {

// Parameters agree to this absolute tolerance: float32 sums taken in a
// different order (per-rank means averaged vs one mean) differ by ~1e-7
// per step; 5 steps of SGD with momentum stay well inside 1e-5.
constexpr double kTolerance = 1e-5;
constexpr int kSteps = 5;

ckpt::StateDict train(const test::TempDir& dir, const std::string& tag, int procs, int batch,
                      const std::vector<std::string>& extra = {}) {
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("equiv"));
  std::vector<std::string> args{"run", job, "--procs", std::to_string(procs), "--run-dir",
                                dir.file(tag), "--set", "training.max_steps=" + std::to_string(kSteps),
                                "--set", "training.batch_size=" + std::to_string(batch)};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = test::cohort(args);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  return ckpt::readStateDict(dir.file(tag + "/model/final.pt"));
}

double maxDifference(const ckpt::StateDict& a, const ckpt::StateDict& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t k = 0; k < a.size() && k < b.size(); ++k) {
    EXPECT_EQ(a[k].first, b[k].first);
    m = std::max(m, (a[k].second.to(torch::kDouble) - b[k].second.to(torch::kDouble))
                        .abs()
                        .max()
                        .item<double>());
  }
  return m;
}

class Equivalence : public ::testing::TestWithParam<std::tuple<int, double>> {};

TEST_P(Equivalence, NRanksEqualOneProcessWithNTimesTheBatch) {
  const auto [ranks, capMb] = GetParam();
  const int b = 4;
  test::TempDir dir;
  auto reference = train(dir, "single", 1, ranks * b);
  auto parallel = train(dir, "parallel", ranks, b,
                        {"--set", "distribution.bucket_cap_mb=" + std::to_string(capMb)});
  const double diff = maxDifference(reference, parallel);
  EXPECT_LT(diff, kTolerance) << ranks << " ranks, bucket cap " << capMb << " MiB";
  RecordProperty("max_parameter_difference", fmt::format("{:.3g}", diff));

  // The bucket layout under test really is many buckets or one.
  const std::string log = test::readText(dir.file("parallel/logs/rank-0.log"));
  EXPECT_NE(log.find(capMb < 1 ? "gradient buckets: 8 " : "gradient buckets: 1 "),
            std::string::npos)
      << log;

  // The comparison can fail: one process with batch b (not N*b) ends elsewhere.
  auto small = train(dir, "small", 1, b);
  EXPECT_GT(maxDifference(reference, small), 100 * kTolerance);
}

INSTANTIATE_TEST_SUITE_P(RanksAndBuckets, Equivalence,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(1e-6, 1000.0)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  (std::get<1>(info.param) < 1 ? "tinyBuckets" : "oneBucket");
                         });

TEST(Reproducibility, SameSeedAndWorldSizeGiveTheSameLossCurve) {
  test::TempDir dir;
  auto a = train(dir, "a", 2, 4, {"--set", "training.max_steps=0", "--set", "training.epochs=2"});
  auto b = train(dir, "b", 2, 4, {"--set", "training.max_steps=0", "--set", "training.epochs=2"});
  EXPECT_EQ(maxDifference(a, b), 0.0);
  auto ma = test::readJsonLines(dir.file("a/metrics.jsonl"));
  auto mb = test::readJsonLines(dir.file("b/metrics.jsonl"));
  ASSERT_EQ(ma.size(), mb.size());
  ASSERT_GT(ma.size(), 10u);
  for (size_t k = 0; k < ma.size(); ++k) {
    ASSERT_EQ(ma[k]["event"], "train");
    EXPECT_EQ(ma[k]["step"], mb[k]["step"]);
    EXPECT_EQ(ma[k]["loss"].get<double>(), mb[k]["loss"].get<double>()) << "step " << ma[k]["step"];
  }
  auto c = train(dir, "c", 2, 4,
                 {"--set", "training.max_steps=0", "--set", "training.epochs=2", "--set",
                  "training.seed=8"});
  EXPECT_GT(maxDifference(a, c), 1e-3) << "the seed changes nothing";
}

}  // namespace
}  // namespace cohort
