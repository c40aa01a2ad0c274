// A debugger on a paused rank (launch/debug.h), with real processes and a
// real gdb: `cohort run --debug 1` holds rank 1 in gdbserver before it
// connects; gdb attaches, breaks in the training step, reads the step
// number, and lets it go; the job completes with bitwise the weights of the
// same job run without a debugger. --debug-on-failure holds a failed rank
// for a debugger, then the job fails as before. Bad --debug ranks and a
// missing gdbserver are bad input (exit 2).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"
#include "util/skip.h"

namespace cohort {
namespace {

using namespace std::chrono_literals;

// The function the tests break in: runs once per optimizer step on every
// rank, its step (counted from 1) the second argument after `this`.
constexpr const char* kStepFunction = "cohort::train::detail::Reporter::stepDone";

bool installed(const char* program) {
  return test::run({"/bin/sh", "-c", std::string("command -v ") + program}, {}, 30s).exitCode == 0;
}

// "HOST:PORT" and the program of the first "attach with: gdb -ex 'target
// remote HOST:PORT' PROGRAM" in `text`; empty when there is none yet.
std::pair<std::string, std::string> attachLine(const std::string& text) {
  static const std::regex line(R"(attach with: gdb -ex 'target remote ([^']+)' (\S+))");
  std::smatch m;
  if (!std::regex_search(text, m, line)) return {};
  return {m[1].str(), m[2].str()};
}

// Waits at most 2 minutes for `p` to print the attach instructions: the
// host:port and program, both empty when `p` ended or the time ran out.
std::pair<std::string, std::string> awaitAttachLine(test::Process& p) {
  std::pair<std::string, std::string> at;
  test::waitUntil([&] { return !(at = attachLine(p.stderrSoFar())).first.empty() || p.exited(); }, 2min);
  return at;
}

// gdb in batch mode against gdbserver at `hostPort`, running `commands`
// after it connected. Local libraries are read from this machine's files.
test::ProcessResult gdb(const std::string& hostPort, const std::string& program,
                        const std::vector<std::string>& commands) {
  std::vector<std::string> argv{"/usr/bin/gdb", "--batch", "-nx", "-iex", "set debuginfod enabled off",
                                "-ex", "set sysroot /", "-ex", "target remote " + hostPort};
  for (const auto& c : commands) {
    argv.push_back("-ex");
    argv.push_back(c);
  }
  argv.push_back(program);
  return test::run(argv, {}, 5min);
}

class Debugger : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!installed("gdb") || !installed("gdbserver")) {
      COHORT_SKIP("gdb and gdbserver are needed (scripts/install-deps.sh installs them)");
    }
  }
};

TEST_F(Debugger, BreakpointInTheStepThenTheJobCompletesBitwiseAsWithout) {
  test::TempDir dir;
  const auto plain = test::trainTiny(dir, "plain", 2, {});
  test::writeText(dir.file("held.yaml"), test::tinyJobYaml("held"));
  test::Process launcher({test::cohortBin(), "run", dir.file("held.yaml"), "--procs", "2", "--run-dir",
                          dir.file("held"), "--debug", "1"});
  const auto at = awaitAttachLine(launcher);
  ASSERT_FALSE(at.first.empty()) << launcher.stderrSoFar();
  EXPECT_NE(launcher.stderrSoFar().find("timeouts suspended"), std::string::npos);
  // VS Code's configuration names the same server and program.
  const auto launchJson = nlohmann::json::parse(test::readText(dir.file("held/debug/launch.json")));
  ASSERT_EQ(launchJson["configurations"].size(), 1u) << launchJson.dump(2);
  const auto& config = launchJson["configurations"][0];
  EXPECT_EQ(config["name"], "cohort rank 1");
  EXPECT_EQ(config["type"], "cppdbg");
  EXPECT_EQ(config["request"], "launch");
  EXPECT_EQ(config["miDebuggerServerAddress"], at.first);
  EXPECT_EQ(config["program"], at.second);

  // The first step this rank completes is step 1: the breakpoint was set
  // before training began. Without debug information (a Release build) the
  // argument is read from its register (x86-64: `this` in rdi, the step in
  // rsi).
  const auto r = gdb(at.first, at.second,
                     {"break " + std::string(kStepFunction), "continue", "printf \"step=%ld\\n\", $rsi", "delete",
                      "detach"});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.out.find("Breakpoint 1, "), std::string::npos) << r.describe();
  EXPECT_NE(r.out.find("stepDone"), std::string::npos) << r.describe();
  EXPECT_NE(r.out.find("step=1\n"), std::string::npos) << r.describe();

  const auto done = launcher.wait(5min);
  ASSERT_EQ(done.exitCode, 0) << done.describe();
  const auto held = ckpt::readStateDict(dir.file("held/model/final.pt"));
  EXPECT_EQ(test::maxDifference(plain, held), 0.0);
  EXPECT_EQ(test::readText(dir.file("plain/model/final.pt")), test::readText(dir.file("held/model/final.pt")));
}

// `cohort agent --debug 0`: the agent's rank is held the same way; a
// debugger that detaches at once (before the rank saw it attach) lets it go
// on, and the job completes.
TEST_F(Debugger, TheAgentHoldsARankAndAnAtOnceDetachLetsItGoOn) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("agent"));
  test::Process agent({test::cohortBin(), "agent", dir.file("job.yaml"), "--nnodes", "1", "--procs", "2", "--rdzv",
                       "store://127.0.0.1:" + std::to_string(test::freePort()) + "/held", "--run-dir",
                       dir.file("run"), "--debug", "0"});
  const auto at = awaitAttachLine(agent);
  ASSERT_FALSE(at.first.empty()) << agent.stderrSoFar();
  const auto r = gdb(at.first, at.second, {"detach"});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  const auto done = agent.wait(5min);
  EXPECT_EQ(done.exitCode, 0) << done.describe();
  EXPECT_NE(done.err.find("rank 0: the debugger let it go on"), std::string::npos) << done.describe();
  EXPECT_EQ(done.err.find("re-forming"), std::string::npos) << done.describe();
}

TEST_F(Debugger, AFailedRankWaitsForADebuggerThenTheJobFails) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("fails"));
  test::Process launcher({test::cohortBin(), "run", dir.file("job.yaml"), "--procs", "2", "--run-dir",
                          dir.file("run"), "--set", "distribution.max_restarts=0", "--debug-on-failure", "600"},
                         {{"COHORT_FAULT", "segv@rank1:step2"}});
  const auto at = awaitAttachLine(launcher);
  ASSERT_FALSE(at.first.empty()) << launcher.stderrSoFar();
  EXPECT_NE(launcher.stderrSoFar().find("rank 1/2 failed (SIGSEGV)"), std::string::npos) << launcher.stderrSoFar();
  EXPECT_FALSE(launcher.exited()) << "the job ended while rank 1 was held";
  // The backtrace reaches the step where the rank failed.
  const auto r = gdb(at.first, at.second, {"thread apply all bt", "detach"});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.out.find("FaultPlan::afterStep"), std::string::npos) << r.describe();
  // Detached: the wait ends, and the job fails as it would have.
  const auto done = launcher.wait(5min);
  EXPECT_EQ(done.exitCode, 1) << done.describe();
  EXPECT_NE(done.err.find("was killed by signal 11 (SIGSEGV)"), std::string::npos) << done.describe();
  // Rank 0, which then lost its peer, does not wait for a debugger too.
  EXPECT_EQ(done.err.find("rank 0 failed ("), std::string::npos) << done.describe();
}

TEST_F(Debugger, AnExceptionWaitsTheWindowThenTheJobFails) {
  test::TempDir dir;
  const auto r = test::runJob(dir, "throws", test::tinyJobYaml("throws"), 2, {"distribution.max_restarts=0"},
                              {{"COHORT_FAULT", "throw@rank1:step2"}}, {"--debug-on-failure", "1"});
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("rank 1 failed (COHORT_FAULT: an error thrown after step 2); it waits 1 s for a debugger"),
            std::string::npos)
      << r.describe();
  EXPECT_NE(r.err.find("no longer waiting for a debugger"), std::string::npos) << r.describe();
}

TEST(DebugOptions, RanksThatDoNotExistAreBadInput) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("bad"));
  for (const std::string ranks : {"2", "-1", "one", "0,", "1,,0", ""}) {
    const auto r = test::cohort({"run", dir.file("job.yaml"), "--procs", "2", "--run-dir", dir.file("run"),
                                 "--debug", ranks});
    EXPECT_EQ(r.exitCode, 2) << ranks << ": " << r.describe();
    EXPECT_NE(r.err.find("--debug"), std::string::npos) << ranks << ": " << r.describe();
    EXPECT_FALSE(std::filesystem::exists(dir.file("run"))) << ranks;
  }
  const auto r = test::cohort({"run", dir.file("job.yaml"), "--procs", "2", "--debug", "2"});
  EXPECT_NE(r.err.find("rank 2 does not exist; the job has 2 ranks"), std::string::npos) << r.describe();
}

TEST(DebugOptions, WithoutGdbserverTheRunIsRefusedNamingThePackage) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("nogdb"));
  const auto r = test::cohort({"run", dir.file("job.yaml"), "--procs", "2", "--run-dir", dir.file("run"), "--debug",
                               "1"},
                              {{"PATH", dir.path()}});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("Debian package gdbserver"), std::string::npos) << r.describe();
  EXPECT_FALSE(std::filesystem::exists(dir.file("run")));
}

}  // namespace
}  // namespace cohort
