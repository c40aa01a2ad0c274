// `cohort logs`: the logs of a run merged in time order, one rank, and
// --follow as a real process that prints lines as they are appended and ends
// with the run.

#include "cohort/monitor/logs.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "util/jobs.h"

namespace cohort {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kLauncher =
    "2026-11-21 21:19:40.000 info [launcher] starting 2 ranks of job 'j'; run directory /r\n"
    "2026-11-21 21:19:45.500 info [launcher] every rank had completed when the signal arrived\n";
const std::string kRank0 =
    "2026-11-21 21:19:41.100 info [rank 0/2] cohort worker: rank 0/2 started\n"
    "2026-11-21 21:19:43.370 info [rank 0/2] step 10\n"
    "2026-11-21 21:19:44.000 info [rank 0/2] same time as rank 1\n";
const std::string kRank1 =
    "2026-11-21 21:19:41.050 info [rank 1/2] cohort worker: rank 1/2 started\n"
    "2026-11-21 21:19:42.000 warn [rank 1/2] a message\n"
    "over two lines\n"
    "2026-11-21 21:19:44.000 info [rank 1/2] same time as rank 0\n"
    "2026-11-21 21:19:44.000 info [rank 1/2] second at that time\n";
const std::string kMerged =
    "2026-11-21 21:19:40.000 info [launcher] starting 2 ranks of job 'j'; run directory /r\n"
    "2026-11-21 21:19:41.050 info [rank 1/2] cohort worker: rank 1/2 started\n"
    "2026-11-21 21:19:41.100 info [rank 0/2] cohort worker: rank 0/2 started\n"
    "2026-11-21 21:19:42.000 warn [rank 1/2] a message\n"
    "over two lines\n"
    "2026-11-21 21:19:43.370 info [rank 0/2] step 10\n"
    "2026-11-21 21:19:44.000 info [rank 0/2] same time as rank 1\n"
    "2026-11-21 21:19:44.000 info [rank 1/2] same time as rank 0\n"
    "2026-11-21 21:19:44.000 info [rank 1/2] second at that time\n"
    "2026-11-21 21:19:45.500 info [launcher] every rank had completed when the signal arrived\n";

void writeRun(const test::TempDir& dir) {
  test::writeText(dir.file("logs/launcher.log"), kLauncher);
  test::writeText(dir.file("logs/rank-0.log"), kRank0);
  test::writeText(dir.file("logs/rank-1.log"), kRank1);
}

void append(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::app | std::ios::binary);
  out << text;
}

// summary.json appears at once, complete (as writeFileAtomic writes it).
void writeSummary(const test::TempDir& dir, const std::string& status) {
  test::writeText(dir.file("summary.json.tmp"), "{\"status\": \"" + status + "\"}\n");
  std::filesystem::rename(dir.file("summary.json.tmp"), dir.file("summary.json"));
}

// `cohort logs ARGS` with its stdout sent to stderr, which test::Process
// lets us read while it runs.
std::unique_ptr<test::Process> startLogs(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" 1>&2", test::cohortBin(),
                                "logs"};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<test::Process>(argv);
}

// Polls the process's output until it holds `text`, within a deadline.
bool waitForOutput(test::Process& p, const std::string& text,
                   std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (p.stderrSoFar().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Whether the process has exited, without reaping it.
bool hasExited(const test::Process& p) {
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(p.pid()), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
         info.si_pid == p.pid();
}

TEST(Logs, MergeKeepsTimeOrderTiesAndContinuations) {
  EXPECT_EQ(monitor::mergeLogs({kLauncher, kRank0, kRank1}), kMerged);
  // Ties go to the earlier text; a text's leading untimed line comes first.
  EXPECT_EQ(monitor::mergeLogs({"2026-01-01 00:00:00.000 info [b] 1\n",
                                "early\n2026-01-01 00:00:00.000 info [a] 2\n"}),
            "early\n2026-01-01 00:00:00.000 info [b] 1\n2026-01-01 00:00:00.000 info [a] 2\n");
  EXPECT_EQ(monitor::mergeLogs({}), "");
}

TEST(Logs, MergesEveryFileOfARun) {
  test::TempDir dir;
  writeRun(dir);
  auto r = test::cohort({"logs", dir.path()});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.out, kMerged);
}

TEST(Logs, RankKeepsOneRankOnly) {
  test::TempDir dir;
  writeRun(dir);
  test::writeText(dir.file("logs/rank-10.log"), "2026-11-21 21:19:41.000 info [rank 10/11] ten\n");
  auto r = test::cohort({"logs", dir.path(), "--rank", "1"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.out, kRank1);
  auto ten = test::cohort({"logs", dir.path(), "--rank", "10"});
  EXPECT_EQ(ten.out, "2026-11-21 21:19:41.000 info [rank 10/11] ten\n") << ten.describe();
}

TEST(Logs, MissingRunOrLogsExitTwoNamingThePath) {
  test::TempDir dir;
  auto missing = test::cohort({"logs", dir.file("nope")});
  EXPECT_EQ(missing.exitCode, 2) << missing.describe();
  EXPECT_NE(missing.err.find(dir.file("nope")), std::string::npos) << missing.err;

  auto notRun = test::cohort({"logs", dir.path()});  // neither logs/ nor job.yaml
  EXPECT_EQ(notRun.exitCode, 2) << notRun.describe();
  EXPECT_NE(notRun.err.find(dir.path()), std::string::npos) << notRun.err;

  std::filesystem::create_directories(dir.file("logs"));
  auto empty = test::cohort({"logs", dir.path()});
  EXPECT_EQ(empty.exitCode, 2) << empty.describe();
  EXPECT_NE(empty.err.find(dir.file("logs")), std::string::npos) << empty.err;

  writeRun(dir);
  auto noRank = test::cohort({"logs", dir.path(), "--rank", "5"});
  EXPECT_EQ(noRank.exitCode, 2) << noRank.describe();
  EXPECT_NE(noRank.err.find(dir.file("logs/rank-5.log")), std::string::npos) << noRank.err;
  EXPECT_EQ(test::cohort({"logs", dir.path(), "--rank", "-1"}).exitCode, 2);
}

TEST(Logs, FollowPrintsAppendedLinesAndEndsWithTheRun) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), "name: j\n");
  test::writeText(dir.file("logs/launcher.log"),
                  "2026-11-21 21:19:40.000 info [launcher] starting 2 ranks\n");
  auto p = startLogs({dir.path(), "--follow"});
  ASSERT_TRUE(waitForOutput(*p, "starting 2 ranks")) << p->stderrSoFar();

  // A rank's log that appears after the follower started.
  append(dir.file("logs/rank-0.log"), "2026-11-21 21:19:41.000 info [rank 0/2] first of rank 0\n");
  ASSERT_TRUE(waitForOutput(*p, "first of rank 0")) << p->stderrSoFar();

  // A line still being written is held back until its newline.
  append(dir.file("logs/rank-1.log"), "2026-11-21 21:19:42.000 info [rank 1/2] half a li");
  append(dir.file("logs/rank-0.log"), "2026-11-21 21:19:42.500 info [rank 0/2] marker\n");
  ASSERT_TRUE(waitForOutput(*p, "marker")) << p->stderrSoFar();
  EXPECT_EQ(p->stderrSoFar().find("half a li"), std::string::npos) << p->stderrSoFar();
  append(dir.file("logs/rank-1.log"), "ne\nwith a continuation\n");
  ASSERT_TRUE(waitForOutput(*p, "half a line\nwith a continuation\n")) << p->stderrSoFar();
  EXPECT_FALSE(hasExited(*p)) << "ended before the run did";

  // The run ends: summary.json, then a rank's last lines as it exits.
  writeSummary(dir, "completed");
  append(dir.file("logs/rank-0.log"), "2026-11-21 21:19:50.000 info [rank 0/2] done\n");
  auto r = p->wait(std::chrono::seconds(30));
  EXPECT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.err,
            "2026-11-21 21:19:40.000 info [launcher] starting 2 ranks\n"
            "2026-11-21 21:19:41.000 info [rank 0/2] first of rank 0\n"
            "2026-11-21 21:19:42.500 info [rank 0/2] marker\n"
            "2026-11-21 21:19:42.000 info [rank 1/2] half a line\n"
            "with a continuation\n"
            "2026-11-21 21:19:50.000 info [rank 0/2] done\n");
}

TEST(Logs, FollowEndsWhenTheLauncherGivesUp) {
  test::TempDir dir;
  writeRun(dir);
  writeSummary(dir, "stopped");  // an earlier attempt's: the run goes on
  auto p = startLogs({dir.path(), "--follow", "--rank", "0"});
  ASSERT_TRUE(waitForOutput(*p, "same time as rank 1")) << p->stderrSoFar();
  EXPECT_FALSE(hasExited(*p));
  append(dir.file("logs/launcher.log"),
         "2026-11-21 21:20:00.000 error [launcher] rank 1 (pid 42) exited with code 1; stopped "
         "the other ranks. Its log: /r/logs/rank-1.log\n");
  auto r = p->wait(std::chrono::seconds(30));
  EXPECT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.err, kRank0) << "--rank 0 prints rank 0's lines only";
}

TEST(Logs, FollowOfAFinishedRunPrintsItAndEnds) {
  test::TempDir dir;
  writeRun(dir);
  writeSummary(dir, "completed");
  auto r = test::cohort({"logs", dir.path(), "--follow"}, {}, std::chrono::seconds(30));
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.out, kMerged);
}

TEST(Logs, FollowEndsOnSigint) {
  test::TempDir dir;
  writeRun(dir);
  auto p = startLogs({dir.path(), "-f"});
  ASSERT_TRUE(waitForOutput(*p, "second at that time")) << p->stderrSoFar();
  p->signal(SIGINT);
  auto r = p->wait(std::chrono::seconds(30));
  EXPECT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 128 + SIGINT) << r.describe();
  EXPECT_EQ(r.err, kMerged);
}

}  // namespace
}  // namespace cohort
