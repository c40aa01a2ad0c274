// A stop signal at any moment of a job's life under `cohort run`: before any
// rank starts, while a rank starts (before its signal thread, before the
// rendezvous, before the model is built) and after training. Each ends in a
// checkpoint, or with nothing new to save, and exit 75 (after training: the
// job completes); running the same command again completes the job. The
// processes pause at the moment named (COHORT_TEST_PAUSE, core/env.h) until
// the signal has been sent.

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "util/jobs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct Moment {
  const char* point;  // the pause point (core/env.h)
  int processes;      // how many processes pause there
  int code;           // the exit code after SIGTERM
};

void PrintTo(const Moment& m, std::ostream* os) { *os << m.point; }

nlohmann::json summaryOf(const std::string& run) {
  std::error_code ec;
  if (!fs::exists(run + "/summary.json", ec)) return nlohmann::json::object();
  return nlohmann::json::parse(test::readText(run + "/summary.json"));
}

class StopWhileStarting : public ::testing::TestWithParam<Moment> {};

TEST_P(StopWhileStarting, SigtermEndsInACheckpointOrNothingToSaveAndTheRerunCompletes) {
  const Moment m = GetParam();
  test::TempDir dir;
  const std::string pause = dir.file("pause");
  fs::create_directories(pause);
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("starting"));
  const std::string run = dir.file("run");
  const std::vector<std::string> args{test::cohortBin(), "run", job, "--procs", "2", "--run-dir", run,
                                      "--set", "training.epochs=3", "--set", "training.max_steps=8"};
  {
    test::Process launcher(args, {{"COHORT_TEST_PAUSE", std::string(m.point) + ":" + pause}});
    ASSERT_TRUE(test::waitUntil(
        [&] { return int(test::pausedAt(pause, m.point).size()) == m.processes || launcher.exited(); }, 120s))
        << launcher.stderrSoFar();
    ASSERT_EQ(int(test::pausedAt(pause, m.point).size()), m.processes) << launcher.stderrSoFar();
    // To the launcher's whole process group, as a terminal, systemd or a
    // scheduler sends it: the launcher and every rank get it.
    ASSERT_EQ(kill(-launcher.pid(), SIGTERM), 0);
    // Before its signal thread, a rank (or the launcher, before its loop)
    // holds the signal, blocked since its first instruction, instead of
    // dying of it.
    if (std::string(m.point) == "start" || std::string(m.point) == "launcher") {
      for (pid_t pid : test::pausedAt(pause, m.point)) EXPECT_TRUE(test::signalPending(pid, SIGTERM)) << pid;
    }
    test::writeText(pause + "/" + m.point + ".go", "");
    const auto r = launcher.wait(120s);
    ASSERT_FALSE(r.timedOut) << r.describe();
    EXPECT_EQ(r.exitCode, m.code) << r.describe();
    const auto summary = summaryOf(run);
    if (std::string(m.point) == "launcher") {
      EXPECT_NE(r.err.find("received SIGTERM while no rank runs: nothing new to save"), std::string::npos)
          << r.err;
      EXPECT_FALSE(fs::exists(run + "/logs/rank-0.log")) << "a rank started after the stop";
    } else if (m.code == 75) {
      // Stopped after the first steps, with a checkpoint of the last one.
      // On the console (before the run directory's log exists) or in the log.
      const std::string said = r.err + test::readText(run + "/logs/rank-1.log");
      EXPECT_NE(said.find("received SIGTERM while starting"), std::string::npos) << said;
      EXPECT_EQ(summary.value("status", ""), "stopped") << summary.dump();
      EXPECT_GE(summary.value("steps", 0), 1) << summary.dump();
      EXPECT_TRUE(fs::exists(run + "/checkpoints/step-" + std::to_string(summary.value("steps", 0)) +
                             "/manifest.json"))
          << summary.dump();
    } else {
      // After training: the job completes as if nothing came.
      EXPECT_EQ(summary.value("status", ""), "completed") << summary.dump();
      EXPECT_TRUE(fs::exists(run + "/model/final.pt"));
    }
  }
  if (m.code != 75) return;
  // The same command again: the job completes, from the checkpoint when
  // there is one.
  const auto again = test::run(args, {}, 120s);
  ASSERT_EQ(again.exitCode, 0) << again.describe();
  const auto summary = summaryOf(run);
  EXPECT_EQ(summary.value("status", ""), "completed") << summary.dump();
  EXPECT_EQ(summary.value("steps", 0), 8) << summary.dump();
  if (std::string(m.point) != "launcher") {
    ASSERT_TRUE(summary.contains("resumed_from")) << summary.dump();
    EXPECT_GE(summary["resumed_from"].value("step", 0), 1) << summary.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Moments, StopWhileStarting,
                         ::testing::Values(Moment{"launcher", 1, 75}, Moment{"start", 2, 75},
                                           Moment{"rendezvous", 2, 75}, Moment{"model", 2, 75},
                                           Moment{"final", 2, 0}),
                         [](const auto& info) { return std::string(info.param.point); });

}  // namespace
}  // namespace cohort
