// The hierarchical exchange when a rank dies: 4 `cohort worker` processes
// as 2 machines x 2 (COHORT_MACHINE_ID), started without a launcher so
// that nothing stops the survivors but their own error handling. When one
// rank SIGKILLs itself, every other rank must fail with an error naming a
// rank that is gone -- noticed through shared memory (its process exited) or
// Gloo (a peer closed the connection) -- and none may wait for the
// collective timeout (300 s here; the test's limit is below it).

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <regex>

#include "util/jobs.h"

namespace cohort {
namespace {

class HierarchicalFault : public ::testing::TestWithParam<int> {};

TEST_P(HierarchicalFault, EveryOtherRankFailsNamingARankThatIsGone) {
  const int killed = GetParam();
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("fault"));
  auto ranks = test::startWorkers(
      job, dir.file("run"), 4,
      [](int) {
        return std::vector<std::string>{
            "--set", "training.epochs=4", "--set", "training.batch_size=2",
            // No metrics allreduce between steps: the next collective after
            // the kill is the gradient exchange.
            "--set", "training.log_every=1000", "--set", "distribution.timeout_s=300"};
      },
      {{"COHORT_MACHINE_ID", "a,a,b,b"},
       {"COHORT_FAULT", fmt::format("kill@rank{}:step3", killed)}});
  // A rank that is gone: "rank R (pid P) has exited" from shared memory, or
  // Gloo's failure on a closed connection.
  const std::regex named(R"(rank \d+: .*(rank \d+ \(pid \d+\) has exited|failed \(a peer may have died\)))");
  for (int r = 0; r < 4; ++r) {
    auto res = ranks[static_cast<size_t>(r)]->wait(std::chrono::minutes(4));
    ASSERT_FALSE(res.timedOut) << "rank " << r << " hung:\n" << res.describe();
    if (r == killed) {
      EXPECT_EQ(res.signal, SIGKILL) << res.describe();
      continue;
    }
    EXPECT_NE(res.exitCode, 0) << "rank " << r << ":\n" << res.describe();
    EXPECT_TRUE(std::regex_search(res.err, named)) << "rank " << r << ":\n" << res.err;
    EXPECT_EQ(res.err.find("timed out"), std::string::npos) << "rank " << r << ":\n" << res.err;
    // The other rank of its machine sees it go through shared memory.
    if (r == (killed ^ 1)) {
      EXPECT_NE(res.err.find(fmt::format("rank {} (pid", killed)), std::string::npos) << res.err;
    }
  }
  const std::string log = test::readText(dir.file("run/logs/rank-1.log"));
  EXPECT_NE(log.find("gradient exchange: hierarchical: 2 machines"), std::string::npos) << log;
}

// Rank 3 shares a machine with rank 2, its leader; rank 2 leads machine b.
INSTANTIATE_TEST_SUITE_P(Killed, HierarchicalFault, ::testing::Values(3, 2),
                         [](const auto& info) {
                           return info.param == 3 ? std::string("NonLeader") : std::string("Leader");
                         });

}  // namespace
}  // namespace cohort
