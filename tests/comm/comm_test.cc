// The process group over Gloo/TCP: interface or address selection and the
// errors of a rendezvous that cannot complete.

#include <gtest/gtest.h>
#include <sys/stat.h>

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

// Ranks started without a launcher, rank 0 hosting the store on every
// interface (0.0.0.0; the others reach it through the same address).
std::string tokenFile(const test::TempDir& dir, const std::string& name, const std::string& token) {
  const std::string path = dir.file(name);
  test::writeText(path, token + "\n");
  ::chmod(path.c_str(), 0600);
  return path;
}

TEST(Comm, AStoreBeyondLoopbackWillNotStartWithoutAToken) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("open"));
  auto r = test::cohort({"worker", job, "--run-dir", dir.file("run")},
                        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "0.0.0.0"},
                         {"MASTER_PORT", std::to_string(test::freePort())}},
                        std::chrono::minutes(2));
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("beyond loopback, without a store token"), std::string::npos) << r.err;
}

TEST(Comm, RanksProveTheStoreTokenBeforeTheyJoin) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("token"));
  const std::string good = tokenFile(dir, "good", "a6f0c2d9e8b7a6f0c2d9e8b7a6f0c2d9");
  const std::string bad = tokenFile(dir, "bad", "0000000000000000000000000000000000");
  auto runWithTokens = [&](const std::string& tag, const std::string& rank1Token) {
    auto ranks = test::startWorkers(
        job, dir.file(tag), 2,
        [&](int r) {
          return std::vector<std::string>{"--set", "training.max_steps=2", "--set",
                                          "distribution.timeout_s=8", "--set",
                                          "distribution.interface=127.0.0.1", "--set",
                                          "security.store_token_file=" + (r == 0 ? good : rank1Token)};
        },
        {{"MASTER_ADDR", "0.0.0.0"}});
    std::vector<test::ProcessResult> results;
    for (auto& p : ranks) results.push_back(p->wait(std::chrono::minutes(2)));
    return results;
  };
  auto same = runWithTokens("same", good);
  EXPECT_EQ(same[0].exitCode, 0) << same[0].describe();
  EXPECT_EQ(same[1].exitCode, 0) << same[1].describe();

  auto differ = runWithTokens("differ", bad);
  EXPECT_EQ(differ[1].exitCode, 2) << differ[1].describe();
  EXPECT_NE(differ[1].err.find("refused this rank's store token"), std::string::npos)
      << differ[1].err;
  EXPECT_NE(differ[0].exitCode, 0) << differ[0].describe();  // its peer never joined
  EXPECT_NE(differ[0].err.find("does not hold the job's store token"), std::string::npos)
      << differ[0].err;
  for (const auto& r : differ) {
    EXPECT_EQ(r.err.find("a6f0c2d9e8b7"), std::string::npos) << "a token was printed: " << r.err;
  }
}

}  // namespace
}  // namespace cohort
