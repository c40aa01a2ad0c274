// The operator profiler (`cohort run --profile STEPS`): its table from
// nested events, and real 2-rank runs of the tiny job: the operator files
// of each rank hold cohort's phases and LibTorch's operators, the trace
// parses in TensorBoard's layout with the profiler's and the timeline's
// events, and a run without it writes no profile. Bad ranges exit 2.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "cohort/core/net.h"
#include "cohort/monitor/profiler.h"
#include "monitor/detail/profile_files.h"
#include "util/jobs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(OperatorTable, SelfTimeLeavesOutTheNestedEvents) {
  // thread 1: forward [0, 100) holds aten::linear [10, 70) holding
  // aten::addmm [20, 60); a second aten::addmm [80, 90) of other shapes.
  // thread 2: aten::addmm [0, 30) alone.
  std::vector<monitor::ProfiledEvent> events{
      {"aten::addmm", 1, 20, 40, "[[4], [8, 16], [16, 4]]", 2048},
      {"forward", 1, 0, 100, "[]", -1},
      {"aten::linear", 1, 10, 60, "[[8, 16], [4, 16], [4]]", -1},
      {"aten::addmm", 1, 80, 10, "[[2], [8, 16], [16, 2]]", 1024},
      {"aten::addmm", 2, 0, 30, "[[4], [8, 16], [16, 4]]", 2048},
  };
  const std::vector<monitor::OperatorRow> rows = monitor::operatorTable(events);
  ASSERT_EQ(rows.size(), 4u);
  // Sorted by self time: addmm of the first shapes 40 + 30, forward 100 -
  // 60 - 10, linear 60 - 40, addmm of the second shapes 10.
  EXPECT_EQ(rows[0].name, "aten::addmm");
  EXPECT_EQ(rows[0].inputShapes, "[[4], [8, 16], [16, 4]]");
  EXPECT_EQ(rows[0].calls, 2);
  EXPECT_DOUBLE_EQ(rows[0].selfUs, 70);
  EXPECT_DOUBLE_EQ(rows[0].totalUs, 70);
  EXPECT_DOUBLE_EQ(rows[0].flops, 4096);
  EXPECT_EQ(rows[1].name, "forward");
  EXPECT_DOUBLE_EQ(rows[1].selfUs, 30);
  EXPECT_DOUBLE_EQ(rows[1].totalUs, 100);
  EXPECT_LT(rows[1].flops, 0);
  EXPECT_EQ(rows[2].name, "aten::linear");
  EXPECT_DOUBLE_EQ(rows[2].selfUs, 20);
  EXPECT_EQ(rows[3].inputShapes, "[[2], [8, 16], [16, 2]]");
  EXPECT_DOUBLE_EQ(rows[3].selfUs, 10);
}

TEST(OperatorTable, MatrixProductsCountTheirFlopsFromTheirShapes) {
  using monitor::detail::productFlops;
  EXPECT_DOUBLE_EQ(productFlops("aten::mm", {{4096, 128}, {128, 512}}), 2.0 * 4096 * 128 * 512);
  EXPECT_DOUBLE_EQ(productFlops("aten::addmm", {{16}, {8, 32}, {32, 16}, {}, {}}), 2.0 * 8 * 32 * 16);
  EXPECT_DOUBLE_EQ(productFlops("aten::bmm", {{64, 256, 32}, {64, 32, 256}}), 2.0 * 64 * 256 * 32 * 256);
  EXPECT_DOUBLE_EQ(productFlops("aten::baddbmm", {{256, 256}, {64, 256, 32}, {64, 32, 256}, {}, {}}),
                   2.0 * 64 * 256 * 32 * 256);
  // Linear layers through oneDNN (models/linear.h): x [m, in], W [out, in], dy [m, out].
  EXPECT_DOUBLE_EQ(productFlops("cohort::linear", {{4096, 128}, {384, 128}}), 2.0 * 4096 * 128 * 384);
  EXPECT_DOUBLE_EQ(productFlops("cohort::linear_grad_input", {{4096, 384}, {384, 128}}), 2.0 * 4096 * 128 * 384);
  EXPECT_DOUBLE_EQ(productFlops("cohort::linear_grad_weight", {{4096, 384}, {4096, 128}}), 2.0 * 4096 * 128 * 384);
  EXPECT_LT(productFlops("cohort::linear", {{4096, 128}}), 0);
  // Convolutions as products (models/gemm_conv.h, models/window_conv.h):
  // unfolded input [rows, taps], W [out, taps], dy [rows, out].
  EXPECT_DOUBLE_EQ(productFlops("cohort::gemm_conv", {{32, 4608}, {512, 4608}}), 2.0 * 32 * 4608 * 512);
  EXPECT_DOUBLE_EQ(productFlops("cohort::gemm_conv_grad_input", {{32, 512}, {512, 4608}}), 2.0 * 32 * 4608 * 512);
  EXPECT_DOUBLE_EQ(productFlops("cohort::gemm_conv_grad_weight", {{32, 512}, {32, 4608}}), 2.0 * 32 * 4608 * 512);
  EXPECT_DOUBLE_EQ(productFlops("cohort::window_conv", {{32, 512}, {512, 512}}), 2.0 * 32 * 512 * 512);
  EXPECT_LT(productFlops("cohort::gemm_conv_grad_bias", {{32, 512}, {512, 4608}}), 0);
  EXPECT_LT(productFlops("aten::relu", {{8, 8}}), 0);
  EXPECT_LT(productFlops("aten::mm", {{8, 8}}), 0);           // shapes missing
  EXPECT_LT(productFlops("aten::bmm", {{8, 8}, {8, 8}}), 0);  // not batched
}

// A 2-rank run of the tiny job (6 steps) with `args` after the job.
struct ProfiledRun {
  explicit ProfiledRun(const std::vector<std::string>& extra) {
    test::writeText(dir.file("job.yaml"), test::tinyJobYaml("profiled"));
    std::vector<std::string> args{"run",         dir.file("job.yaml"), "--procs", "2", "--run-dir",
                                  dir.file("run"), "--set",            "distribution.shared_memory=false"};
    args.insert(args.end(), extra.begin(), extra.end());
    result = test::cohort(args, {}, 3min);
  }
  std::string run(const std::string& rel) const { return dir.file("run/" + rel); }
  test::TempDir dir;
  test::ProcessResult result;
};

TEST(Profiler, EachRankWritesItsOperatorsAndATraceTensorBoardReads) {
  ProfiledRun r({"--profile", "2-4", "--set", "checkpoint.every_steps=3", "--set", "checkpoint.when_behind=wait"});
  ASSERT_EQ(r.result.exitCode, 0) << r.result.describe();
  // Rank 0's table is on the console.
  EXPECT_NE(r.result.err.find("operator profile of steps 2-4 on rank 0"), std::string::npos) << r.result.err;
  const auto traceDirs = fs::directory_iterator(r.run("tensorboard/plugins/profile"));
  const std::vector<fs::path> times(fs::begin(traceDirs), fs::end(traceDirs));
  ASSERT_EQ(times.size(), 1u) << "one <time> directory for every rank";
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::string base = r.run("profile/operators-rank-" + std::to_string(rank));
    nlohmann::json table;
    ASSERT_NO_THROW(table = nlohmann::json::parse(test::readText(base + ".json")));
    EXPECT_EQ(table["rank"], rank);
    EXPECT_EQ(table["steps"], nlohmann::json::array({2, 4}));
    std::map<std::string, int64_t> calls;
    bool matrixProduct = false;
    double lastSelf = 1e300;
    for (const auto& op : table["operators"]) {
      const std::string name = op["name"].get<std::string>();
      calls[name] += op["calls"].get<int64_t>();
      EXPECT_LE(op["self_us"].get<double>(), lastSelf) << "sorted by self time";
      lastSelf = op["self_us"].get<double>();
      EXPECT_LE(op["self_us"].get<double>(), op["total_us"].get<double>() + 1e-9) << name;
      ASSERT_TRUE(op["input_shapes"].is_string());
      ASSERT_TRUE(op["flops"].is_null() || op["flops"].is_number());
      if ((name == "aten::addmm" || name == "aten::mm") && op["calls"].get<int64_t>() > 0 &&
          op["input_shapes"].get<std::string>().find("[8, ") != std::string::npos) {
        matrixProduct = true;
        if (name == "aten::addmm") {
          EXPECT_GT(op["flops"].get<double>(), 0);
        }
      }
    }
    EXPECT_TRUE(matrixProduct) << table.dump(1);
    // 3 steps: each phase once per step; the checkpoint at step 3.
    for (const char* phase : {"data", "forward", "loss", "backward", "exchange", "optimizer"}) {
      EXPECT_EQ(calls[phase], 3) << phase;
    }
    EXPECT_EQ(calls["checkpoint"], 1);
    for (const char* step : {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}) EXPECT_EQ(calls[step], 1);
    EXPECT_EQ(calls.count("ProfilerStep#1") + calls.count("ProfilerStep#5"), 0u);
    const std::string csv = test::readText(base + ".csv");
    EXPECT_EQ(csv.rfind("name,calls,self_us,total_us,input_shapes,flops\n", 0), 0u) << csv.substr(0, 200);
    EXPECT_NE(csv.find("\nforward,3,"), std::string::npos);

    const std::string tracePath =
        times[0].string() + "/" + hostName() + "_" + std::to_string(rank) + ".pt.trace.json";
    nlohmann::json trace;
    ASSERT_NO_THROW(trace = nlohmann::json::parse(test::readText(tracePath))) << tracePath;
    ASSERT_TRUE(trace["traceEvents"].is_array());
    EXPECT_EQ(trace["distributedInfo"]["rank"], rank);
    EXPECT_EQ(trace["distributedInfo"]["world_size"], 2);
    std::multiset<std::string> cpuOps, annotations, timeline;
    for (const auto& e : trace["traceEvents"]) {
      ASSERT_EQ(e["pid"], rank);
      if (e["ph"] != "X") continue;
      EXPECT_GT(e["ts"].get<int64_t>(), 1'600'000'000'000'000);  // microseconds since 1970: one clock
      const std::string cat = e["cat"].get<std::string>();
      const std::string name = e["name"].get<std::string>();
      if (cat == "cpu_op") {
        cpuOps.insert(name);
        EXPECT_TRUE(e["args"].contains("Input Dims")) << e.dump();
      } else if (cat == "user_annotation") {
        annotations.insert(name);
      } else {
        timeline.insert(name);
      }
    }
    EXPECT_GT(cpuOps.count("aten::addmm"), 0u);
    EXPECT_EQ(annotations.count("forward"), 3u);
    EXPECT_EQ(annotations.count("ProfilerStep#3"), 1u);
    // cohort's timeline over the same steps (its thread 0 and the Gloo allreduces).
    EXPECT_EQ(timeline.count("forward"), 3u);
    EXPECT_EQ(timeline.count("optimizer"), 3u);
    EXPECT_EQ(timeline.count("allreduce bucket 0"), 3u);
    EXPECT_EQ(timeline.count("checkpoint (training blocked)"), 1u);
  }
  // No timeline was asked for: the profiler's capture wrote no file of it.
  EXPECT_FALSE(fs::exists(r.run("timeline")));
}

TEST(Profiler, OffWritesNoProfile) {
  ProfiledRun r({"--set", "training.epochs=1"});
  ASSERT_EQ(r.result.exitCode, 0) << r.result.describe();
  EXPECT_FALSE(fs::exists(r.run("profile")));
  EXPECT_FALSE(fs::exists(r.run("tensorboard/plugins")));
}

TEST(Profiler, ARangeEndingPastTheRunIsCutWithAWarning) {
  ProfiledRun r({"--profile", "5-40"});
  ASSERT_EQ(r.result.exitCode, 0) << r.result.describe();
  EXPECT_NE(r.result.err.find("ends past the run's last step, 6: profiling steps 5-6"), std::string::npos)
      << r.result.err;
  const nlohmann::json table = nlohmann::json::parse(test::readText(r.run("profile/operators-rank-1.json")));
  EXPECT_EQ(table["steps"], nlohmann::json::array({5, 6}));
}

TEST(Profiler, BadRangesExitTwoNamingTheOption) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("bad"));
  for (const std::string range : {"22-20", "-", "abc", "0-", "", "0", "3-x"}) {
    SCOPED_TRACE("--profile '" + range + "'");
    const auto r = test::cohort({"run", dir.file("job.yaml"), "--run-dir", dir.file("run"), "--profile", range});
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.err.find("--profile"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir.file("run"))) << "refused before anything starts";
  }
  // The job file's key: named with its file and line.
  test::writeText(dir.file("job2.yaml"), test::tinyJobYaml("bad") + "  profile: 9-3\n");
  const auto r = test::cohort({"validate", dir.file("job2.yaml")});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("output.profile"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("reversed"), std::string::npos) << r.err;
}

TEST(Profiler, ARangePastTheRunsLastStepIsAnError) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("past"));
  const auto r = test::cohort({"run", dir.file("job.yaml"), "--procs", "2", "--run-dir", dir.file("run"),
                               "--profile", "20-22"},
                              {}, 3min);
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("the run has 6 steps"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("run/profile")));
}

}  // namespace
}  // namespace cohort
