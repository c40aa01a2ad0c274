// The fork server (launch/fork_server.h) with real processes: `cohort run`'s
// ranks are forked from one process that loaded LibTorch, are the
// launcher's children with their own command line and environment, train
// bitwise as exec'd ranks do, and when the server is gone the launcher
// starts ranks by exec. COHORT_FORK_SERVER=0 starts them by exec always.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"

namespace cohort {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> nulSeparated(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> out;
  for (std::string s; std::getline(in, s, '\0');) {
    if (!s.empty()) out.push_back(s);
  }
  return out;
}

bool contains(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

std::string status(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return line.substr(field.size() + 2);
  }
  return "";
}

// A 2-rank `cohort run` that trains until stopped, its processes marked.
struct LongRun {
  explicit LongRun(std::map<std::string, std::string> env, std::vector<std::string> extra = {}) {
    std::random_device rd;
    tag = std::to_string(getpid()) + "-" + std::to_string(rd());
    env["COHORT_TEST_TAG"] = tag;
    test::writeText(dir.file("job.yaml"), test::tinyJobYaml("forked"));
    std::vector<std::string> args{test::cohortBin(), "run",   dir.file("job.yaml"), "--procs", "2", "--run-dir",
                                  dir.file("run"),   "--set", "training.epochs=100000"};
    args.insert(args.end(), extra.begin(), extra.end());
    launcher = std::make_unique<test::Process>(args, env);
  }
  // The launcher's children whose environment says RANK=<r>, by rank; the
  // others (the fork server) in `others`.
  std::map<int, pid_t> ranks(std::vector<pid_t>* others = nullptr) const {
    std::map<int, pid_t> out;
    for (pid_t p : launcher->children()) {
      const auto env = nulSeparated("/proc/" + std::to_string(p) + "/environ");
      bool rank = false;
      for (int r = 0; r < 2; ++r) {
        if (contains(env, "RANK=" + std::to_string(r))) {
          out[r] = p;
          rank = true;
        }
      }
      if (!rank && others != nullptr) others->push_back(p);
    }
    return out;
  }
  bool training() const {
    std::ifstream in(dir.file("run/metrics.jsonl"));
    std::string line;
    return std::getline(in, line) && !line.empty();
  }
  // Waits (bounded) until the ranks train, and finds them and the server.
  bool waitForRanksAndServer(std::map<int, pid_t>& found, std::vector<pid_t>& others) const {
    return test::waitUntil(
        [&] {
          others.clear();
          found = ranks(&others);
          return training() && found.size() == 2 && others.size() == 1;
        },
        std::chrono::seconds(120));
  }

  test::TempDir dir;
  std::string tag;
  std::unique_ptr<test::Process> launcher;
};

TEST(ForkServer, RanksAreForkedFromItAsTheLaunchersChildrenWithTheirOwnCommandLineAndEnvironment) {
  LongRun run({}, {"--set", "distribution.max_restarts=0"});
  std::map<int, pid_t> ranks;
  std::vector<pid_t> others;
  ASSERT_TRUE(run.waitForRanksAndServer(ranks, others)) << run.launcher->stderrSoFar();
  // The server: cohort-torch --fork-server, the launcher's child.
  const auto serverArgs = nulSeparated("/proc/" + std::to_string(others[0]) + "/cmdline");
  ASSERT_GE(serverArgs.size(), 2u);
  EXPECT_EQ(serverArgs[1], "--fork-server");
  for (const auto& [r, pid] : ranks) {
    // Each rank: the launcher's child, showing `cohort-torch worker ...`
    // and its own environment, and saying that it was forked.
    EXPECT_EQ(status(pid, "PPid"), std::to_string(run.launcher->pid()));
    const auto args = nulSeparated("/proc/" + std::to_string(pid) + "/cmdline");
    ASSERT_GE(args.size(), 2u);
    EXPECT_NE(args[0].find("cohort-torch"), std::string::npos) << args[0];
    EXPECT_EQ(args[1], "worker");
    const auto env = nulSeparated("/proc/" + std::to_string(pid) + "/environ");
    EXPECT_TRUE(contains(env, "WORLD_SIZE=2"));
    EXPECT_TRUE(contains(env, "COHORT_TEST_TAG=" + run.tag));
    EXPECT_FALSE(contains(env, "COHORT_FORK_SERVER_FD=3"));
  }
  // The launcher waits for a forked rank as for its own: a SIGKILL is seen
  // and named.
  ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  const auto r = run.launcher->wait(120s);
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("rank 1 (pid " + std::to_string(ranks[1]) + ") was killed by signal 9 (SIGKILL)"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(test::processesWithEnv("COHORT_TEST_TAG=" + run.tag).empty()) << "a process outlived the launcher";
  // Rank 0, stopped by the launcher, flushed its log: it says it was forked.
  const std::string log = test::readText(run.dir.file("run/logs/rank-0.log"));
  EXPECT_NE(log.find("(forked from its fork server, pid " + std::to_string(others[0]) + ")"), std::string::npos)
      << log;
}

// The server killed while the ranks train: the restart after a rank's
// failure starts the ranks by exec, with a warning, and the job completes.
TEST(ForkServer, WhenTheServerIsGoneRanksAreStartedByExec) {
  // Rank 0 holds after step 2 (the first attempt only), so that the test
  // acts while the first ranks run.
  LongRun run({{"COHORT_FAULT", "sleep30@rank0:step2"}},
              {"--set", "distribution.max_restarts=1", "--set", "distribution.stop_timeout_s=2", "--set",
               "checkpoint.every_steps=1", "--set", "training.max_steps=4"});
  std::map<int, pid_t> ranks;
  std::vector<pid_t> others;
  ASSERT_TRUE(run.waitForRanksAndServer(ranks, others)) << run.launcher->stderrSoFar();
  ASSERT_EQ(kill(others[0], SIGKILL), 0);
  ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  const auto r = run.launcher->wait(180s);
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.err.find("restart 1 of at most 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ranks are started by exec from now on"), std::string::npos) << r.err;
  const std::string log = test::readText(run.dir.file("run/logs/rank-1.log"));
  const auto second = log.rfind("cohort worker: ");
  ASSERT_NE(second, std::string::npos) << log;
  EXPECT_EQ(log.find("forked", second), std::string::npos) << log.substr(second);
  EXPECT_TRUE(test::processesWithEnv("COHORT_TEST_TAG=" + run.tag).empty());
}

// Forked or exec'd, the ranks compute the same: bitwise the same weights.
// COHORT_FORK_SERVER=0 starts them by exec.
TEST(ForkServer, ForkedRanksTrainBitwiseAsExecdOnes) {
  test::TempDir dir;
  const auto forked = test::trainTiny(dir, "forked", 2, {"training.epochs=2"});
  const auto execd = test::trainTiny(dir, "execd", 2, {"training.epochs=2"}, {{"COHORT_FORK_SERVER", "0"}});
  EXPECT_EQ(test::maxDifference(forked, execd), 0.0);
  EXPECT_NE(test::readText(dir.file("forked/logs/rank-1.log")).find("forked from its fork server"),
            std::string::npos);
  EXPECT_EQ(test::readText(dir.file("execd/logs/rank-1.log")).find("forked"), std::string::npos);
}

}  // namespace
}  // namespace cohort
