// A short 2-rank run on a slice of Fashion-MNIST learns, and leaves a
// complete run directory.

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "util/jobs.h"

namespace cohort {
namespace {

TEST(FashionMnist, ShortTwoRankRunLearnsAndWritesTheRunDirectory) {
  test::TempDir dir;
  const std::string run = dir.file("run");
  auto r = test::cohort({"run", test::sourceDir() + "/examples/fashion-mnist.yaml", "--run-dir",
                         run, "--set", "data.train.limit=6000", "--set", "data.eval.limit=2000",
                         "--set", "training.epochs=2", "--set", "training.log_every=10"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();

  auto summary = nlohmann::json::parse(test::readText(run + "/summary.json"));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["epochs"], 2);
  EXPECT_EQ(summary["eval"]["samples"], 2000);
  // Chance is 0.1; a CNN that learns is far above it after 2 short epochs.
  EXPECT_GT(summary["eval"]["top1"].get<double>(), 0.7) << summary.dump(2);
  EXPECT_GE(summary["eval"]["top5"].get<double>(), summary["eval"]["top1"].get<double>());

  auto metrics = test::readJsonLines(run + "/metrics.jsonl");
  int train = 0, eval = 0;
  for (const auto& m : metrics) {
    if (m["event"] == "train") {
      ++train;
      for (const char* k : {"step", "epoch", "loss", "lr", "images_per_s", "data_wait_frac"}) {
        EXPECT_TRUE(m.contains(k)) << k << " missing in " << m.dump();
      }
      EXPECT_GT(m["images_per_s"].get<double>(), 0);
      EXPECT_GE(m["data_wait_frac"].get<double>(), 0);
      EXPECT_LE(m["data_wait_frac"].get<double>(), 1);
    } else if (m["event"] == "eval") {
      ++eval;
      EXPECT_GE(m["top1"].get<double>(), 0);
      EXPECT_LE(m["top1"].get<double>(), 1);
    }
  }
  EXPECT_EQ(eval, 2);
  EXPECT_GE(train, 4);  // 47 steps per epoch, a record every 10

  for (const char* f : {"job.yaml", "logs/rank-0.log", "logs/rank-1.log", "logs/launcher.log",
                        "model/final.pt"}) {
    EXPECT_TRUE(std::filesystem::exists(run + "/" + f)) << f;
  }
  EXPECT_NE(test::readText(run + "/logs/rank-1.log").find("[rank 1/2]"), std::string::npos);
  // The resolved job runs as is.
  auto v = test::cohort({"validate", run + "/job.yaml"});
  EXPECT_EQ(v.exitCode, 0) << v.describe();
  EXPECT_NE(v.out.find("procs_per_node: 2"), std::string::npos);
  // Console: rank 0's summary.
  EXPECT_NE(r.err.find("test top-1"), std::string::npos);
}

}  // namespace
}  // namespace cohort
