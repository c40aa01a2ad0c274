// `cohort run` with real rank processes: a failing or killed rank stops the
// job naming it, signals stop every rank, and no process is left behind.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "util/jobs.h"

namespace cohort {
namespace {

using namespace std::chrono_literals;

// A launcher of a job that trains until stopped, with an environment marker
// its ranks inherit, so the test can find every process it started.
struct TaggedRun {
  explicit TaggedRun(std::map<std::string, std::string> env = {},
                     std::vector<std::string> extraArgs = {}) {
    std::random_device rd;
    const std::string tag = std::to_string(getpid()) + "-" + std::to_string(rd());
    marker = "COHORT_TEST_TAG=" + tag;
    env["COHORT_TEST_TAG"] = tag;
    const std::string job = dir.file("job.yaml");
    test::writeText(job, test::tinyJobYaml("long"));
    std::vector<std::string> args{test::cohortBin(), "run", job, "--procs", "2", "--run-dir",
                                  dir.file("run"), "--set", "training.epochs=100000"};
    args.insert(args.end(), extraArgs.begin(), extraArgs.end());
    launcher = std::make_unique<test::Process>(args, env);
  }
  // Processes still alive that this run started.
  std::vector<pid_t> survivors() const { return test::processesWithEnv(marker); }

  test::TempDir dir;
  std::string marker;
  std::unique_ptr<test::Process> launcher;
};

// Waits (bounded) until rank 0 has written a train record: the ranks are up
// and training.
bool waitForTraining(const test::TempDir& dir, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(dir.file("run/metrics.jsonl"));
    std::string line;
    if (std::getline(in, line) && !line.empty()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

pid_t rankPid(const test::Process& launcher, int rank) {
  const std::string wanted = "RANK=" + std::to_string(rank);
  for (pid_t p : launcher.children()) {
    std::ifstream in("/proc/" + std::to_string(p) + "/environ", std::ios::binary);
    for (std::string entry; std::getline(in, entry, '\0');) {
      if (entry == wanted) return p;
    }
  }
  return -1;
}

// Without restarts, a failure ends the job.
const std::vector<std::string> kNoRestarts = {"--set", "distribution.max_restarts=0"};

TEST(Launcher, RankExitingWithCode3StopsTheJobNamingIt) {
  TaggedRun run(std::map<std::string, std::string>{{"COHORT_FAULT", "exit3@rank1:step3"}},
                kNoRestarts);
  auto r = run.launcher->wait(120s);
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") exited with code 3; stopped the other ranks"), std::string::npos) << r.err;
  EXPECT_TRUE(run.survivors().empty()) << "a rank outlived the launcher";
  RecordProperty("launcher_seconds", std::to_string(r.seconds));
}

TEST(Launcher, SigkilledRankStopsTheJobNamingIt) {
  TaggedRun run({}, kNoRestarts);
  ASSERT_TRUE(waitForTraining(run.dir, 120s)) << run.launcher->stderrSoFar();
  const pid_t victim = rankPid(*run.launcher, 1);
  ASSERT_GT(victim, 0) << "rank 1 not found among the launcher's children";
  const auto killedAt = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  auto r = run.launcher->wait(120s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killedAt).count();
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("rank 1 (pid " + std::to_string(victim) +
                       ") was killed by signal 9 (SIGKILL); stopped the other ranks"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(run.survivors().empty()) << "a rank outlived the launcher";
  RecordProperty("seconds_from_kill_to_launcher_exit", std::to_string(seconds));
}

TEST(Launcher, FailedRankRestartsTheJobFromItsCheckpoint) {
  // The fault fires in the first attempt only.
  TaggedRun run(std::map<std::string, std::string>{{"COHORT_FAULT", "exit4@rank1:step2"}},
                {"--set", "distribution.max_restarts=1", "--set", "checkpoint.every_steps=1",
                 "--set", "training.max_steps=4"});
  auto r = run.launcher->wait(120s);
  ASSERT_FALSE(r.timedOut) << r.describe();
  // The restart completed the 4 steps (from the newest checkpoint committed
  // before the failure, if any: tests/ckpt/recovery_test.cc checks resuming).
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.err.find("restart 1 of at most 1"), std::string::npos) << r.err;
  const std::string summary = test::readText(run.dir.file("run/summary.json"));
  EXPECT_NE(summary.find("\"restart_count\": 1"), std::string::npos) << summary;
  EXPECT_NE(summary.find("exited with code 4"), std::string::npos) << summary;
  EXPECT_TRUE(run.survivors().empty());
}

TEST(Launcher, DivergedTrainingIsNotRestarted) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("diverge"));
  auto r = test::cohort({"run", job, "--procs", "2", "--run-dir", dir.file("run"), "--set",
                         "training.optimizer.lr=1e30", "--set", "training.epochs=20"});
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("training diverged"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart 1 of"), std::string::npos) << r.err;
}

TEST(Launcher, RestartsGiveUpAfterMaxRestarts) {
  // ":always": the fault fires in every attempt.
  TaggedRun run(std::map<std::string, std::string>{{"COHORT_FAULT", "exit4@rank0:step2:always"}},
                {"--set", "distribution.max_restarts=2", "--set", "checkpoint.every_steps=1"});
  auto r = run.launcher->wait(180s);
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("restart 2 of at most 2"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart 3 of"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("giving up after 2 restarts"), std::string::npos) << r.err;
  EXPECT_TRUE(run.survivors().empty());
}

// Without checkpoints there is nothing to save: SIGTERM stops at once.
TEST(Launcher, SigtermToTheLauncherStopsEveryRank) {
  TaggedRun run({}, {"--set", "checkpoint.enabled=false"});
  ASSERT_TRUE(waitForTraining(run.dir, 120s)) << run.launcher->stderrSoFar();
  run.launcher->signal(SIGTERM);
  auto r = run.launcher->wait(120s);
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 128 + SIGTERM) << r.describe();
  EXPECT_NE(r.err.find("interrupted: every rank stopped"), std::string::npos) << r.err;
  EXPECT_TRUE(run.survivors().empty()) << "a rank outlived the launcher";
  // The ranks logged why they stopped.
  EXPECT_NE(test::readText(run.dir.file("run/logs/rank-1.log")).find("received SIGTERM, stopping"),
            std::string::npos);
}

// SIGTERM to one rank only (a node's preemption notice): every rank stops
// after the same step with a checkpoint, and the launcher exits 75.
TEST(Launcher, SigtermToOneRankStopsEveryRankAfterACheckpoint) {
  TaggedRun run;
  ASSERT_TRUE(waitForTraining(run.dir, 120s)) << run.launcher->stderrSoFar();
  const pid_t rank1 = rankPid(*run.launcher, 1);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(kill(rank1, SIGTERM), 0);
  auto r = run.launcher->wait(120s);
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 75) << r.describe();
  const std::string log0 = test::readText(run.dir.file("run/logs/rank-0.log"));
  const std::string log1 = test::readText(run.dir.file("run/logs/rank-1.log"));
  const std::string what = "stopped on request after step ";
  const auto at0 = log0.find(what), at1 = log1.find(what);
  ASSERT_NE(at0, std::string::npos) << log0;
  ASSERT_NE(at1, std::string::npos) << log1;
  EXPECT_EQ(log0.substr(at0, log0.find(' ', at0 + what.size()) - at0),
            log1.substr(at1, log1.find(' ', at1 + what.size()) - at1));
  EXPECT_TRUE(run.survivors().empty());
}

// A repeated SIGTERM to the launcher does not cut the checkpoint short.
TEST(Launcher, RepeatedSigtermStillStopsAfterACheckpoint) {
  TaggedRun run;
  ASSERT_TRUE(waitForTraining(run.dir, 120s)) << run.launcher->stderrSoFar();
  run.launcher->signal(SIGTERM);
  // The second one once the launcher has acted on the first (two pending
  // SIGTERMs would be delivered as one).
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (test::readText(run.dir.file("run/logs/launcher.log")).find("received SIGTERM") ==
             std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  run.launcher->signal(SIGTERM);
  auto r = run.launcher->wait(120s);
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 75) << r.describe();
  EXPECT_NE(r.err.find("every rank stopped after writing a checkpoint"), std::string::npos)
      << r.err;
  EXPECT_TRUE(run.survivors().empty());
}

TEST(Launcher, RanksDieWithASigkilledLauncher) {
  TaggedRun run;
  ASSERT_TRUE(waitForTraining(run.dir, 120s)) << run.launcher->stderrSoFar();
  ASSERT_EQ(run.survivors().size(), 4u);  // launcher, its fork server, 2 ranks
  // Kill only the launcher (not its group): the ranks must follow on their own.
  kill(run.launcher->pid(), SIGKILL);
  run.launcher->wait(60s);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!run.survivors().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(run.survivors().empty()) << "orphaned ranks";
}

TEST(Launcher, WorksWhenStartedWithSigchldIgnored) {
  // An ignored SIGCHLD survives exec; the kernel would then reap the ranks
  // itself and waitpid() would never report them.
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("sigchld"));
  const std::string cmd = "trap '' CHLD; exec " + test::cohortBin() + " run " + job +
                          " --procs 2 --run-dir " + dir.file("run") + " --set training.max_steps=3";
  auto r = test::run({"/bin/bash", "-c", cmd}, {}, 120s);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.err.find("done: 1 epochs, 3 steps"), std::string::npos) << r.err;
}

TEST(Launcher, CorruptDataInARankExitsWithBadInputCode) {
  test::TempDir dir;
  // Valid-looking paths, but the images file is truncated.
  std::string images = test::readText(test::fashionMnistDir() + "/t10k-images-idx3-ubyte.gz");
  ASSERT_FALSE(images.empty()) << "dataset-fashion-mnist is not installed";
  test::writeText(dir.file("images.gz"), images.substr(0, images.size() / 3));
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("corrupt"));
  auto r = test::cohort({"run", job, "--procs", "2", "--run-dir", dir.file("run"), "--set",
                         "data.train.kind=idx", "--set", "data.train.images=" + dir.file("images.gz"),
                         "--set",
                         "data.train.labels=" + test::fashionMnistDir() + "/t10k-labels-idx1-ubyte.gz",
                         "--set", "model.num_classes=10", "--set", "data.train.shape=[1, 28, 28]"},
                        {}, 120s);
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find(dir.file("images.gz")), std::string::npos) << r.err;
}

TEST(Launcher, BadJobFileExitsTwoBeforeStartingRanks) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("bad"));
  auto r = test::cohort({"run", job, "--run-dir", dir.file("run"), "--set", "training.epochs=0"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("--set training.epochs=0: training.epochs: must be >= 1, got 0"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("run/logs/rank-0.log")));
}

}  // namespace
}  // namespace cohort
