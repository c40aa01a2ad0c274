// The memory a rank may use when each rank has a memory cgroup of its own
// (Slurm's task/cgroup, a Kubernetes container per rank) and when the ranks
// share one (`cohort run` starts its ranks in its own): real processes in
// real cgroups (root only; skipped otherwise). A rank divides a limit only
// among the ranks that live under it.

#include <gtest/gtest.h>

#include "util/cgroup.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/skip.h"

namespace cohort {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kLimit = int64_t{900} << 20;

// Two ranks of the tiny job (external launcher), rank r run through
// groupOf(r); rank r's log.
std::vector<std::string> trainTwo(const test::TempDir& dir, const std::string& tag,
                                  const std::function<const test::MemoryCgroup&(int)>& groupOf) {
  const std::string job = dir.file(tag + ".yaml");
  test::writeText(job, test::tinyJobYaml(tag));
  const std::string run = dir.file(tag);
  auto ranks = test::startWorkers(
      job, run, 2, [](int) { return std::vector<std::string>{"--set", "training.max_steps=2"}; }, {},
      [&](int r, const std::vector<std::string>& argv) { return groupOf(r).wrap(argv); });
  std::vector<std::string> logs;
  for (int r = 0; r < 2; ++r) {
    const auto res = ranks[static_cast<size_t>(r)]->wait(120s);
    EXPECT_EQ(res.exitCode, 0) << res.describe();
    logs.push_back(test::readText(run + "/logs/rank-" + std::to_string(r) + ".log"));
  }
  return logs;
}

TEST(MemoryShare, ARankInACgroupOfItsOwnHasItsWholeLimitAndRanksSharingOneDivideIt) {
  test::MemoryCgroup first("share-a"), second("share-b");
  if (!first.unavailable().empty()) COHORT_SKIP(first.unavailable());
  first.setLimit(kLimit);
  second.setLimit(kLimit);
  test::TempDir dir;
  // One cgroup per rank: each has 900 MB to itself.
  const auto own = trainTwo(dir, "own", [&](int r) -> const test::MemoryCgroup& { return r == 0 ? first : second; });
  EXPECT_NE(own[0].find("memory limit: 900 MB (" + first.limitFile() + ") for 1 rank, 900 MB each"),
            std::string::npos)
      << own[0];
  EXPECT_NE(own[1].find("memory limit: 900 MB (" + second.limitFile() + ") for 1 rank, 900 MB each"),
            std::string::npos)
      << own[1];
  // Both ranks in one: 450 MB each.
  const auto shared = trainTwo(dir, "shared", [&](int) -> const test::MemoryCgroup& { return first; });
  for (const auto& log : shared) {
    EXPECT_NE(log.find("memory limit: 900 MB (" + first.limitFile() + ") for 2 ranks, 450 MB each"),
              std::string::npos)
        << log;
  }
}

}  // namespace
}  // namespace cohort
