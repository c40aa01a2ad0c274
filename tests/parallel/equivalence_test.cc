// Reference test of the DDP engine with real processes: after k steps, N ranks
// with batch b each hold the same parameters as one process with batch N*b
// (model without BatchNorm or dropout), whatever the bucket layout.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "util/jobs.h"
#include "util/runs.h"

namespace cohort {
namespace {

// Parameters agree to this absolute tolerance: float32 sums taken in a
// different order (per-rank means averaged vs one mean) differ by ~1e-8
// after 5 steps here; 1e-5 leaves room for other machines' kernels.
constexpr double kEquivalenceTolerance = 1e-5;

std::vector<std::string> steps(int batch, std::vector<std::string> more = {}) {
  more.push_back("training.max_steps=5");
  more.push_back("training.batch_size=" + std::to_string(batch));
  return more;
}

class Equivalence : public ::testing::TestWithParam<std::tuple<int, double>> {};

TEST_P(Equivalence, NRanksEqualOneProcessWithNTimesTheBatch) {
  const auto [ranks, capMb] = GetParam();
  const int b = 4;
  test::TempDir dir;
  auto reference = test::trainTiny(dir, "single", 1, steps(ranks * b));
  auto parallel = test::trainTiny(
      dir, "parallel", ranks, steps(b, {"distribution.bucket_cap_mb=" + std::to_string(capMb)}));
  const double diff = test::maxDifference(reference, parallel);
  EXPECT_LT(diff, kEquivalenceTolerance) << ranks << " ranks, bucket cap " << capMb << " MiB";
  RecordProperty("max_parameter_difference", fmt::format("{:.3g}", diff));

  // The bucket layout under test really is one bucket per parameter, or one.
  const std::string log = test::readText(dir.file("parallel/logs/rank-0.log"));
  EXPECT_NE(log.find(capMb < 1 ? "gradient buckets: 8 " : "gradient buckets: 1 "),
            std::string::npos)
      << log;

  // The comparison can fail: one process with batch b (not N*b) ends elsewhere.
  auto small = test::trainTiny(dir, "small", 1, steps(b));
  EXPECT_GT(test::maxDifference(reference, small), 100 * kEquivalenceTolerance);
}

INSTANTIATE_TEST_SUITE_P(RanksAndBuckets, Equivalence,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(1e-6, 1000.0)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  (std::get<1>(info.param) < 1 ? "tinyBuckets" : "oneBucket");
                         });

// The exchange path is chosen by the machine: ranks on one machine use
// shared memory; the Gloo path (several machines) must give the same result.
TEST(Exchange, SharedMemoryAndGlooAgreeAndTheLogSaysWhichRan) {
  test::TempDir dir;
  auto shm = test::trainTiny(dir, "shm", 2, steps(4, {"distribution.bucket_cap_mb=1e-6"}));
  auto gloo = test::trainTiny(
      dir, "gloo", 2, steps(4, {"distribution.bucket_cap_mb=1e-6", "distribution.shared_memory=false"}));
  EXPECT_LT(test::maxDifference(shm, gloo), kEquivalenceTolerance);
  EXPECT_NE(test::readText(dir.file("shm/logs/rank-1.log")).find("gradient exchange: shared memory"),
            std::string::npos);
  EXPECT_EQ(test::readText(dir.file("gloo/logs/rank-1.log")).find("gradient exchange: shared memory"),
            std::string::npos);
}

// Ranks on several machines (formed on this host with COHORT_MACHINE_ID, a
// list with one machine per rank) take the hierarchical exchange: shared
// memory within each machine, Gloo between one rank per machine. It must
// give the parameters of Gloo among all ranks.
struct Machines {
  const char* name;
  const char* ids;  // COHORT_MACHINE_ID
  int ranks;
  double capMb;
  const char* placement;  // how the rank logs describe rank 1's machine
};

void PrintTo(const Machines& m, std::ostream* os) { *os << m.ids; }

class Hierarchical : public ::testing::TestWithParam<Machines> {};

TEST_P(Hierarchical, EqualsGlooAmongAllRanksAndTheLogSaysHierarchical) {
  const Machines m = GetParam();
  test::TempDir dir;
  const std::string cap = "distribution.bucket_cap_mb=" + std::to_string(m.capMb);
  auto gloo = test::trainTiny(dir, "gloo", m.ranks,
                              steps(4, {cap, "distribution.shared_memory=false"}));
  auto hier = test::trainTiny(dir, "hier", m.ranks, steps(4, {cap}), {{"COHORT_MACHINE_ID", m.ids}});
  const double diff = test::maxDifference(gloo, hier);
  EXPECT_LT(diff, kEquivalenceTolerance) << m.ids;
  RecordProperty("max_parameter_difference", fmt::format("{:.3g}", diff));
  for (int r = 0; r < m.ranks; ++r) {
    const std::string log = test::readText(dir.file(fmt::format("hier/logs/rank-{}.log", r)));
    EXPECT_NE(log.find("gradient exchange: hierarchical: 2 machines, shared memory within, Gloo across"),
              std::string::npos)
        << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("path: hierarchical"), std::string::npos) << "rank " << r << ":\n" << log;
  }
  const std::string log1 = test::readText(dir.file("hier/logs/rank-1.log"));
  EXPECT_NE(log1.find(m.placement), std::string::npos) << log1;
  EXPECT_NE(test::readText(dir.file("gloo/logs/rank-0.log")).find("path: gloo"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Machines, Hierarchical,
    ::testing::Values(
        // 2 x 2, a bucket per parameter: the leaders' allreduces overlap backward.
        Machines{"TwoByTwo", "a,a,b,b", 4, 1e-6, "machine 0 with ranks 0, 1)"},
        // 2 x 2 with the ranks of a machine not adjacent, one bucket.
        Machines{"TwoByTwoInterleaved", "a,b,a,b", 4, 1000.0, "machine 1 with ranks 1, 3; this rank leads it"},
        // 2 + 1: a machine whose only rank takes part as its leader.
        Machines{"TwoPlusOne", "a,a,b", 3, 1e-6, "machine 0 with ranks 0, 1)"}),
    [](const auto& info) { return std::string(info.param.name); });

// Gradients rounded to fp16 on Gloo's wire move the parameters a little,
// within a stated tolerance (the exact roundings are checked in
// compression_test.cc); on the pure shared-memory path the option is
// ignored and says so.
TEST(Exchange, Fp16CompressionStaysCloseToFloat32) {
  test::TempDir dir;
  const std::vector<std::string> gloo{"distribution.shared_memory=false"};
  auto plain = test::trainTiny(dir, "plain", 2, steps(4, gloo));
  auto fp16 = test::trainTiny(
      dir, "fp16", 2, steps(4, {"distribution.shared_memory=false", "distribution.compression=fp16"}));
  auto hier = test::trainTiny(dir, "hier", 4, steps(2, {"distribution.compression=fp16"}),
                              {{"COHORT_MACHINE_ID", "a,a,b,b"}});
  auto hierPlain = test::trainTiny(dir, "hierplain", 4, steps(2, gloo));
  // 5 SGD steps (lr 0.05, momentum 0.9) with gradients off by ~2^-11
  // relative: 2.5e-5 (flat) and 6.6e-6 (hierarchical) here.
  const double diff = test::maxDifference(plain, fp16), diffHier = test::maxDifference(hierPlain, hier);
  EXPECT_LT(diff, 2e-4);
  EXPECT_GT(diff, 0.0) << "fp16 compression changed nothing: not applied?";
  EXPECT_LT(diffHier, 2e-4);
  EXPECT_GT(diffHier, 0.0) << "fp16 compression between machines changed nothing: not applied?";
  RecordProperty("max_parameter_difference", fmt::format("{:.3g} (flat), {:.3g} (hierarchical)", diff, diffHier));
  EXPECT_NE(test::readText(dir.file("fp16/logs/rank-1.log")).find("gradient compression: fp16 on the Gloo exchange"),
            std::string::npos);

  auto shm = test::trainTiny(dir, "shm", 2, steps(4, {"distribution.compression=fp16"}));
  auto shmPlain = test::trainTiny(dir, "shmplain", 2, steps(4));
  EXPECT_EQ(test::maxDifference(shm, shmPlain), 0.0);
  EXPECT_NE(test::readText(dir.file("shm/logs/rank-0.log")).find("distribution.compression fp16 is ignored"),
            std::string::npos);
}

TEST(Reproducibility, SameSeedAndWorldSizeGiveTheSameLossCurve) {
  test::TempDir dir;
  const std::vector<std::string> twoEpochs{"training.epochs=2", "training.batch_size=4"};
  auto a = test::trainTiny(dir, "a", 2, twoEpochs);
  auto b = test::trainTiny(dir, "b", 2, twoEpochs);
  EXPECT_EQ(test::maxDifference(a, b), 0.0);
  // The train records: a straggler record depends on how busy the machine
  // was, not on the training.
  auto trainRecords = [](const std::string& path) {
    std::vector<nlohmann::json> out;
    for (auto& j : test::readJsonLines(path)) {
      if (j["event"] == "train") out.push_back(std::move(j));
    }
    return out;
  };
  auto ma = trainRecords(dir.file("a/metrics.jsonl"));
  auto mb = trainRecords(dir.file("b/metrics.jsonl"));
  ASSERT_EQ(ma.size(), mb.size());
  ASSERT_GT(ma.size(), 10u);
  for (size_t k = 0; k < ma.size(); ++k) {
    EXPECT_EQ(ma[k]["step"], mb[k]["step"]);
    EXPECT_EQ(ma[k]["loss"].get<double>(), mb[k]["loss"].get<double>()) << "step " << ma[k]["step"];
  }
  auto c = test::trainTiny(dir, "c", 2, {"training.epochs=2", "training.batch_size=4",
                                         "training.seed=8"});
  EXPECT_GT(test::maxDifference(a, c), 1e-3) << "the seed changes nothing";
}

}  // namespace
}  // namespace cohort
