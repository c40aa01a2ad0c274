// The process group over Gloo/TCP: interface or address selection and the
// errors of a rendezvous that cannot complete.

#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "util/jobs.h"

namespace cohort {
namespace {

test::ProcessResult runWith(const test::TempDir& dir, const std::string& tag,
                            const std::vector<std::string>& sets) {
  const std::string job = dir.file(tag + ".yaml");
  test::writeText(job, test::tinyJobYaml(tag));
  std::vector<std::string> args{"run", job, "--procs", "2", "--run-dir", dir.file(tag),
                                "--set", "training.max_steps=2"};
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return test::cohort(args, {}, std::chrono::minutes(3));
}

TEST(Comm, CollectivesByInterfaceNameOrAddress) {
  test::TempDir dir;
  auto byName = runWith(dir, "byname", {"distribution.interface=lo"});
  EXPECT_EQ(byName.exitCode, 0) << byName.describe();
  auto byAddress = runWith(dir, "byaddr", {"distribution.interface=127.0.0.1"});
  EXPECT_EQ(byAddress.exitCode, 0) << byAddress.describe();
}

TEST(Comm, UnusableInterfaceFailsNamingIt) {
  test::TempDir dir;
  auto r = runWith(dir, "bad", {"distribution.interface=no-such-host.invalid"});
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("cannot build the process group"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("distribution.interface no-such-host.invalid"), std::string::npos) << r.err;
}

TEST(Comm, MissingPeerTimesOutInsteadOfHanging) {
  // WORLD_SIZE=2 but only rank 0 is started: rendezvous must give up after
  // distribution.timeout_s and say so, not wait forever.
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("alone"));
  auto r = test::cohort({"worker", job, "--run-dir", dir.file("run"), "--set",
                         "distribution.timeout_s=3"},
                        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", std::to_string(test::freePort())}},
                        std::chrono::minutes(2));
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("rank 0"), std::string::npos) << r.err;
}

// Ranks started with different job files (here: another seed on rank 1)
// stop before any collective of training, every rank with the same message
// naming which ranks have what.
TEST(Comm, RanksThatDisagreeOnTheJobAllSayWhichDiffer) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("disagree"));
  auto ranks = test::startWorkers(job, dir.file("run"), 2, [](int r) {
    return std::vector<std::string>{"--set", r == 0 ? "training.seed=7" : "training.seed=8"};
  });
  std::vector<std::string> messages;
  for (auto& p : ranks) {
    auto r = p->wait(std::chrono::minutes(2));
    ASSERT_FALSE(r.timedOut) << r.describe();
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    const size_t at = r.err.find("the ranks disagree on the job");
    ASSERT_NE(at, std::string::npos) << r.err;
    messages.push_back(r.err.substr(at, r.err.find('\n', at) - at));
  }
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("ranks [0] have"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("ranks [1] have"), std::string::npos) << messages[0];
}

}  // namespace
}  // namespace cohort
