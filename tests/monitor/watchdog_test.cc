// The stall inspector, stragglers, non-finite steps and the timeline, with
// real rank processes (`cohort run`): a hung rank is named by the ranks
// waiting for it and the job fails instead of hanging; a slow rank is
// reported; a NaN loss is skipped or stops the run; a timeline loads as a
// Chrome trace.

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <set>

#include "cohort/core/error.h"
#include "cohort/monitor/straggler.h"
#include "cohort/monitor/watchdog.h"
#include "util/jobs.h"

namespace cohort {
namespace {

using namespace std::chrono_literals;

// A 2-rank run of the tiny job with `sets` and `env`; every process it
// starts carries a marker, so the test can check none outlives it.
struct JobRun {
  JobRun(std::vector<std::string> sets, std::map<std::string, std::string> env = {}) {
    std::random_device rd;
    env["COHORT_TEST_TAG"] = std::to_string(getpid()) + "-" + std::to_string(rd());
    marker = "COHORT_TEST_TAG=" + env["COHORT_TEST_TAG"];
    const std::string job = dir.file("job.yaml");
    test::writeText(job, test::tinyJobYaml("watch"));
    std::vector<std::string> args{"run", job, "--procs", "2", "--run-dir", dir.file("run")};
    for (const auto& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    result = test::cohort(args, env, 3min);
  }
  std::string log(int rank) const {
    return test::readText(dir.file("run/logs/rank-" + std::to_string(rank) + ".log"));
  }
  test::TempDir dir;
  std::string marker;
  test::ProcessResult result;
};

TEST(Stall, AHungRankIsNamedAndTheJobFailsInsteadOfHanging) {
  // Rank 1 hangs for 60 s after step 2; rank 0 waits for it in step 3.
  JobRun run({"training.epochs=5", "distribution.heartbeat_s=0.2", "distribution.stall_warn_s=1",
           "distribution.stall_timeout_s=4", "distribution.max_restarts=0",
           "distribution.stop_timeout_s=2"},
          {{"COHORT_FAULT", "sleep60@rank1:step2"}});
  const auto& r = run.result;
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  // The launcher names the rank that gave up and why.
  EXPECT_NE(r.err.find("rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 4"), std::string::npos) << r.err;
  const std::string log0 = run.log(0);
  // Within the warning threshold: who is missing, where and in what.
  const size_t warn = log0.find("warning [rank 0/2] stall: rank 0 has waited");
  ASSERT_NE(warn, std::string::npos) << log0;
  const std::string line = log0.substr(warn, log0.find('\n', warn) - warn);
  EXPECT_NE(line.find("after step 2"), std::string::npos) << line;
  EXPECT_NE(line.find("not there: rank 1 ("), std::string::npos) << line;
  EXPECT_NE(line.find("step 2, optimizer for"), std::string::npos) << line;
  // Then, past stall_timeout_s, the same as an error and the exit.
  EXPECT_NE(log0.find("giving up after 4 s (distribution.stall_timeout_s)"), std::string::npos)
      << log0;
  EXPECT_NE(run.log(1).find("COHORT_FAULT: hanging for 60 s after step 2"), std::string::npos);
  EXPECT_TRUE(test::processesWithEnv(run.marker).empty()) << "a rank outlived the launcher";
}

TEST(Stall, WaitsShorterThanTheThresholdAreNotReported) {
  // The same hang, shorter than stall_warn_s: nothing is reported.
  JobRun run({"training.epochs=2", "distribution.heartbeat_s=0.2", "distribution.stall_warn_s=30",
           "distribution.stall_timeout_s=50"},
          {{"COHORT_FAULT", "sleep1@rank1:step2"}});
  ASSERT_EQ(run.result.exitCode, 0) << run.result.describe();
  EXPECT_EQ(run.log(0).find("stall:"), std::string::npos) << run.log(0);
}

TEST(Straggler, ASlowRankIsReported) {
  // From step 1 on, rank 1 computes 150 ms longer per step than rank 0.
  JobRun run({"training.epochs=2", "training.log_every=3"}, {{"COHORT_FAULT", "slow150@rank1:step1"}});
  ASSERT_EQ(run.result.exitCode, 0) << run.result.describe();
  EXPECT_NE(run.log(0).find("straggler at step"), std::string::npos) << run.log(0);
  EXPECT_NE(run.log(0).find("rank 1: "), std::string::npos) << run.log(0);
  int events = 0;
  for (const auto& j : test::readJsonLines(run.dir.file("run/metrics.jsonl"))) {
    if (j.value("event", "") != "straggler") continue;
    ++events;
    EXPECT_EQ(j["rank"], 1) << j.dump();
    EXPECT_GT(j["compute_ms_per_step"].get<double>(), 1.5 * j["median_ms_per_step"].get<double>());
  }
  EXPECT_GT(events, 0);
}

TEST(Straggler, NoneWithoutAFault) {
  JobRun run({"training.epochs=2", "training.log_every=3", "distribution.straggler_factor=20"});
  ASSERT_EQ(run.result.exitCode, 0) << run.result.describe();
  EXPECT_EQ(run.log(0).find("straggler"), std::string::npos) << run.log(0);
}

TEST(Nonfinite, SkipPolicyDropsTheStepAndGoesOn) {
  // NaN images on rank 0 in step 4: its loss, every gradient after the
  // exchange and its BatchNorm statistics (the ones evaluation and
  // checkpoints use) turn NaN.
  JobRun run({"training.epochs=2", "training.on_nonfinite=skip", "model.batch_norm=true",
              "data.eval.kind=synthetic", "data.eval.size=32", "data.eval.shape=[1, 8, 8]"},
             {{"COHORT_FAULT", "nan@rank0:step3"}});
  ASSERT_EQ(run.result.exitCode, 0) << run.result.describe();
  const auto summary = nlohmann::json::parse(test::readText(run.dir.file("run/summary.json")));
  EXPECT_EQ(summary["nonfinite_skipped"], 1) << summary.dump();
  // The skipped step's statistics were dropped too: evaluation (which uses
  // them) is finite.
  EXPECT_TRUE(std::isfinite(summary["eval"]["loss"].get<double>())) << summary.dump();
  EXPECT_NE(run.log(0).find("step 4: non-finite gradient"), std::string::npos) << run.log(0);
  // Both ranks skipped the same step: their final weights still agree, and
  // the weights are finite.
  bool event = false;
  for (const auto& j : test::readJsonLines(run.dir.file("run/metrics.jsonl"))) {
    if (j.value("event", "") == "nonfinite_skipped") event = j["step"] == 4;
    if (j.contains("loss")) {
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>())) << j.dump();
    }
  }
  EXPECT_TRUE(event);
}

TEST(Nonfinite, StopPolicyEndsTheRunKeepingTheLastGoodCheckpoint) {
  JobRun run({"training.epochs=3", "checkpoint.every_steps=2", "distribution.max_restarts=0"},
          {{"COHORT_FAULT", "nan@rank1:step3"}});
  EXPECT_EQ(run.result.exitCode, 1) << run.result.describe();
  EXPECT_NE(run.result.err.find("training diverged"), std::string::npos) << run.result.err;
  EXPECT_NE(run.result.err.find("exited with code 3"), std::string::npos) << run.result.err;
  // Step 2's checkpoint is there and verifies; nothing after the NaN was saved.
  auto v = test::cohort({"ckpt", "verify", run.dir.file("run/checkpoints/step-2")});
  EXPECT_EQ(v.exitCode, 0) << v.describe();
  EXPECT_FALSE(std::ifstream(run.dir.file("run/checkpoints/step-4/manifest.json")).good());
}

TEST(Timeline, EachRankWritesAChromeTraceOfItsSteps) {
  JobRun run({"training.epochs=1", "output.timeline=true", "distribution.shared_memory=false",
           "checkpoint.every_steps=3", "checkpoint.when_behind=wait"});
  ASSERT_EQ(run.result.exitCode, 0) << run.result.describe();
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = run.dir.file("run/timeline/rank-" + std::to_string(rank) + ".json");
    nlohmann::json trace;
    ASSERT_NO_THROW(trace = nlohmann::json::parse(test::readText(path))) << path;
    ASSERT_TRUE(trace.is_array());
    std::multiset<std::string> names;
    for (const auto& e : trace) {
      ASSERT_EQ(e["pid"], rank);
      if (e["ph"] != "X") continue;
      names.insert(e["name"].get<std::string>());
      EXPECT_GE(e["dur"].get<int64_t>(), 0);
      EXPECT_GT(e["ts"].get<int64_t>(), 1'600'000'000'000'000);  // microseconds since 1970
    }
    // 6 steps of the tiny job on 2 ranks: each phase once per step.
    for (const char* phase : {"data wait", "forward", "backward", "optimizer"}) {
      EXPECT_EQ(names.count(phase), 6u) << phase;
    }
    EXPECT_EQ(names.count("allreduce bucket 0"), 6u);  // Gloo: one bucket per step
    EXPECT_EQ(names.count("checkpoint (training blocked)"), 2u);
    EXPECT_EQ(names.count("checkpoint write"), 2u);
  }
}

TEST(Heartbeat, RoundTripsAndRefusesGarbage) {
  monitor::Heartbeat h;
  h.rank = 3;
  h.step = 41;
  h.phase = "forward";
  h.phaseSeconds = 1.5;
  h.waitingIn = "gradient allreduce";
  h.waitingSeconds = 2.5;
  h.unixTime = 1.8e9;
  h.host = "node-7";
  h.pid = 1234;
  const monitor::Heartbeat back = monitor::decodeHeartbeat(monitor::encodeHeartbeat(h));
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.step, 41);
  EXPECT_EQ(back.phase, "forward");
  EXPECT_EQ(back.waitingIn, "gradient allreduce");
  EXPECT_EQ(back.host, "node-7");
  EXPECT_EQ(back.pid, 1234);
  EXPECT_DOUBLE_EQ(back.waitingSeconds, 2.5);
  EXPECT_THROW(monitor::decodeHeartbeat("{\"rank\": 1}"), DataError);
  EXPECT_THROW(monitor::decodeHeartbeat("not json"), DataError);
}

TEST(Straggler, FoundAgainstTheMedianOfTheOthers) {
  using monitor::findStragglers;
  EXPECT_TRUE(findStragglers({100}, 1.5).empty());
  EXPECT_TRUE(findStragglers({100, 140}, 1.5).empty());
  auto two = findStragglers({100, 160}, 1.5);
  ASSERT_EQ(two.size(), 1u);
  EXPECT_EQ(two[0].rank, 1);
  EXPECT_DOUBLE_EQ(two[0].medianMs, 100);
  auto four = findStragglers({100, 104, 400, 96}, 1.5);
  ASSERT_EQ(four.size(), 1u);
  EXPECT_EQ(four[0].rank, 2);
  EXPECT_DOUBLE_EQ(four[0].medianMs, 100);
  EXPECT_TRUE(findStragglers({100, 400}, 0).empty());  // off
  EXPECT_TRUE(findStragglers({2, 9}, 1.5).empty());     // 3.5x, but 7 ms: noise
  EXPECT_NE(monitor::describe(two[0]).find("rank 1: 160.0 ms"), std::string::npos);
}

}  // namespace
}  // namespace cohort
