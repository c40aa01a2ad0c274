// `cohort plan` end to end: its probes are real `cohort run`s, the run it
// predicts reports the prediction's error in summary.json, bad numbers exit
// 2 before any probe, a job that fits nowhere exits 2 naming the closest
// setting, and --tune writes a job file that loads and is the fastest it
// measured.

#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "util/corpus.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"

namespace cohort {
namespace {

using nlohmann::json;

// Probes that skip measuring the link (given) stay cheap.
const std::vector<std::string> kGivenLink = {"--link-gbps", "10", "--link-latency-us", "50"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool leftovers(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("cohort-plan.", 0) == 0) return true;
  }
  return false;
}

TEST(PlanCli, PredictsTheJobAndARunWithThePlanReportsTheError) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("plan"));
  const std::map<std::string, std::string> env{{"TMPDIR", dir.path()}};
  const std::vector<std::string> outputDir = {"--set", "output.dir=" + dir.file("runs")};
  const auto plan =
      test::cohort(with({"plan", job, "--procs-per-node", "2", "--json", "--price-per-node-hour", "3"}, outputDir), env);
  ASSERT_EQ(plan.exitCode, 0) << plan.describe();
  EXPECT_FALSE(leftovers(dir.path())) << "the probes' directory was left behind";
  const json p = json::parse(plan.out);
  // One rank at two micro-batches, two ranks, the link at two sizes; no
  // recompute probe for a model without blocks.
  EXPECT_EQ(p["probes"], 5);
  EXPECT_EQ(p["fit"]["link_source"], "measured between two local ranks (Gloo over TCP)");
  EXPECT_GT(p["fit"]["link_gbps"].get<double>(), 0);
  const json& predicted = p["predicted"];
  EXPECT_EQ(predicted["setting"]["ranks"], 2);
  EXPECT_GT(predicted["memory_mb"]["runtime"].get<double>(), 10);
  EXPECT_GT(predicted["speed"]["samples_per_s"].get<double>(), 0);
  EXPECT_TRUE(predicted["memory_mb"]["fits"].get<bool>());
  // Utilization: the probes' count of the model's FLOPs (summary.json's), the
  // model FLOP/s a rank is predicted to reach, and that against the ceiling.
  const double flops = p["fit"]["model_flops_per_sample"].get<double>();
  EXPECT_GT(flops, 0) << p["fit"].dump(2);
  const double perRank = predicted["speed"]["samples_per_s"].get<double>() * flops / 2 / 1e9;
  EXPECT_NEAR(predicted["speed"]["model_gflops_per_s_per_rank"].get<double>(), perRank, 1e-9 * perRank);
  ASSERT_TRUE(p["fit"]["gemm_ceiling"].is_object()) << p["fit"].dump(2);
  EXPECT_EQ(p["fit"]["gemm_ceiling"]["threads"], predicted["setting"]["threads_per_rank"]);
  EXPECT_NEAR(predicted["speed"]["mfu"].get<double>(),
              perRank / p["fit"]["gemm_ceiling"]["gflops_per_s"].get<double>(), 1e-9);
  // The table over node counts: more nodes, more node-hours' price per step.
  ASSERT_GE(p["by_nodes"].size(), 7u);
  EXPECT_EQ(p["by_nodes"][0]["setting"]["nodes"], 1);
  for (const auto& row : p["by_nodes"]) {
    EXPECT_NEAR(row["cost"]["price"].get<double>(), 3 * row["cost"]["node_hours"].get<double>(), 1e-9);
  }
  // The plan is kept under output.dir where a run of this very job finds it.
  const std::string kept = dir.file("runs/plans");
  ASSERT_TRUE(std::filesystem::is_directory(kept));
  ASSERT_EQ(std::distance(std::filesystem::directory_iterator(kept), std::filesystem::directory_iterator()), 1);
  const std::string keptFile = std::filesystem::directory_iterator(kept)->path().string();
  EXPECT_EQ(json::parse(test::readText(keptFile))["predicted"], predicted);

  const auto run = test::cohort(with({"run", job, "--procs", "2", "--run-dir", dir.file("run")}, outputDir));
  ASSERT_EQ(run.exitCode, 0) << run.describe();
  const json s = json::parse(test::readText(dir.file("run/summary.json")));
  // The plan counted the model the run trained.
  EXPECT_EQ(p["fit"]["trainable_parameters"].get<double>(), s["trainable_parameters"].get<double>());
  ASSERT_TRUE(s.contains("plan")) << s.dump(1);
  const json& cmp = s["plan"];
  EXPECT_EQ(cmp["file"], keptFile);
  EXPECT_EQ(cmp["predicted"]["peak_rss_mb"], predicted["memory_mb"]["peak"]);
  EXPECT_EQ(cmp["measured"]["peak_rss_mb"], s["peak_rss_mb"]);
  const double error = cmp["error_pct"]["peak_rss_mb"].get<double>();
  EXPECT_NEAR(error,
              100 * (cmp["predicted"]["peak_rss_mb"].get<double>() - s["peak_rss_mb"].get<double>()) /
                  s["peak_rss_mb"].get<double>(),
              1e-6);
  // Loose here (a shared machine); bench/plan-accuracy.sh measures it.
  EXPECT_LT(std::abs(error), 25) << cmp.dump(1);

  // Another job (here: more steps) is not the one planned.
  const auto other = test::cohort(
      with({"run", job, "--procs", "2", "--run-dir", dir.file("other"), "--set", "training.epochs=2"}, outputDir));
  ASSERT_EQ(other.exitCode, 0) << other.describe();
  EXPECT_FALSE(json::parse(test::readText(dir.file("other/summary.json"))).contains("plan"));

  // --plan names the file; one that is not a plan stops the run before it starts.
  test::writeText(dir.file("plan.json"), plan.out);
  const auto named = test::cohort(with({"run", job, "--run-dir", dir.file("named"), "--plan", dir.file("plan.json"),
                                        "--set", "training.epochs=2"},
                                       outputDir));
  ASSERT_EQ(named.exitCode, 0) << named.describe();
  const json n = json::parse(test::readText(dir.file("named/summary.json")));
  EXPECT_EQ(n["plan"]["file"], dir.file("named/plan.json"));
  // One rank: the plan predicted 2 ranks a node, so none of its settings has 1 rank.
  EXPECT_TRUE(n["plan"].contains("note")) << n["plan"].dump(1);
  // A plan that passes for one but holds nonsense never costs the summary.
  test::writeText(dir.file("odd.json"), R"({"predicted": {"setting": {"ranks": 1}, "memory_mb": 3}})");
  const auto odd = test::cohort(
      with({"run", job, "--run-dir", dir.file("odd"), "--plan", dir.file("odd.json"), "--set", "training.epochs=2"},
           outputDir));
  ASSERT_EQ(odd.exitCode, 0) << odd.describe();
  const json o = json::parse(test::readText(dir.file("odd/summary.json")));
  EXPECT_NE(o["plan"].value("note", "").find("not a plan cohort can read"), std::string::npos) << o.dump(1);
  test::writeText(dir.file("bad.json"), "{\"by_nodes\": []}");
  const auto bad = test::cohort({"run", job, "--run-dir", dir.file("bad-run"), "--plan", dir.file("bad.json")});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_NE(bad.err.find("bad.json"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad-run/summary.json")));
}

TEST(PlanCli, APipelineAndATensorSplitOfTheGptArePlannedFromAProbeOfTheSplit) {
  test::TempDir dir;
  test::writeText(dir.file("corpus.txt"), test::corpus(20'000));
  const auto tok = test::cohort({"data", "tokenize", dir.file("corpus.txt"), dir.file("tok"), "--no-progress"});
  ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  const std::string job = dir.file("gpt.yaml");
  test::writeText(job, test::tinyGptYaml("gpt", dir.file("tok/train"), 4));
  const std::map<std::string, std::string> env{{"TMPDIR", dir.path()}};
  const std::vector<std::string> common = with({"--procs-per-node", "2", "--set", "output.dir=" + dir.file("runs")},
                                               kGivenLink);
  // Two stages: each stage's rank, the first holding the micro-batches in
  // flight; the idle share of M + P - 1 slots.
  const auto p2 = test::cohort(with(with({"plan", job, "--json", "--set", "distribution.pipeline.stages=2", "--set",
                                          "distribution.pipeline.micro_batches=4"},
                                         common),
                                    {}),
                               env);
  ASSERT_EQ(p2.exitCode, 0) << p2.describe();
  const json pipe = json::parse(p2.out);
  EXPECT_EQ(pipe["predicted"]["memory_mb"]["stage_peaks"].size(), 2u) << p2.out;
  EXPECT_NEAR(pipe["predicted"]["speed"]["pipeline_idle"].get<double>(), 1.0 / 5, 1e-9);
  EXPECT_EQ(pipe["predicted"]["setting"]["data_replicas"], 1);
  EXPECT_NE(pipe["fit"]["split_probe"].get<std::string>().find("2 stages x 4 micro-batches on 2 local ranks"),
            std::string::npos)
      << p2.out;
  // A tensor split of 2: its sums per step, fitted to its own probe.
  const auto t2 = test::cohort(with({"plan", job, "--set", "distribution.tensor=2"}, common), env);
  ASSERT_EQ(t2.exitCode, 0) << t2.describe();
  EXPECT_NE(t2.out.find("tensor split 2: its sums carry "), std::string::npos) << t2.out;
  EXPECT_NE(t2.out.find("(the split fitted to a probe of tensor 2 on 2 local ranks)"), std::string::npos) << t2.out;
  // A split of a model that is not the GPT is refused before any probe.
  test::writeText(dir.file("cnn.yaml"), test::tinyJobYaml("cnn"));
  const auto cnn = test::cohort(
      with({"plan", dir.file("cnn.yaml"), "--set", "distribution.pipeline.stages=2"}, common), env);
  EXPECT_EQ(cnn.exitCode, 2) << cnn.describe();
  EXPECT_FALSE(leftovers(dir.path()));
}

TEST(PlanCli, NumbersThatAreNotPositiveExitTwoBeforeAnyProbe) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("plan"));
  for (const auto& [option, value] : std::vector<std::pair<std::string, std::string>>{
           {"--nodes", "0"},
           {"--nodes", ""},
           {"--procs-per-node", "1.5"},
           {"--memory-per-rank", "-4G"},
           {"--memory-per-rank", "4Q"},
           {"--price-per-node-hour", "abc"},
           {"--link-gbps", "0"},
           {"--link-latency-us", "-3"},
           {"--cores-per-node", "nan"}}) {
    const auto r = test::cohort({"plan", job, option, value, "--set", "output.dir=" + dir.file("runs")},
                                {{"TMPDIR", dir.path()}});
    EXPECT_EQ(r.exitCode, 2) << option << " " << value << "\n" << r.describe();
    EXPECT_NE(r.err.find(option + " " + value), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("probe"), std::string::npos) << r.err;
  }
}

TEST(PlanCli, AJobThatFitsAtNoSettingExitsTwoNamingTheClosest) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("plan"));
  const auto r = test::cohort(
      with({"plan", job, "--memory-per-rank", "8M", "--set", "output.dir=" + dir.file("runs")}, kGivenLink),
      {{"TMPDIR", dir.path()}});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("cannot fit in 8 MB per rank (--memory-per-rank) at any setting"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the closest, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zero 3"), std::string::npos) << r.err;
  EXPECT_FALSE(leftovers(dir.path()));
}

TEST(PlanCli, SigtermMidProbeEndsTheProbeAndLeavesNothingBehind) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("plan"));
  const std::string marker = "COHORT_PLAN_TEST=" + std::to_string(::getpid());
  test::Process plan({test::cohortBin(), "plan", job, "--set", "output.dir=" + dir.file("runs"), "--set",
                      "training.batch_size=4"},
                     {{"TMPDIR", dir.path()}, {"COHORT_PLAN_TEST", std::to_string(::getpid())}});
  // Its first probe is training (its rank has started).
  const bool training = test::waitUntil(
      [&] {
        for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
          if (e.path().filename().string().rfind("cohort-plan.", 0) == 0 &&
              std::filesystem::exists(e.path() / "one-rank/logs/rank-0.log")) {
            return true;
          }
        }
        return false;
      },
      std::chrono::seconds(60));
  ASSERT_TRUE(training) << plan.stderrSoFar();
  plan.signal(SIGTERM);
  const auto r = plan.wait(std::chrono::seconds(60));
  EXPECT_FALSE(r.timedOut);
  EXPECT_EQ(r.signal, SIGTERM) << r.describe();
  EXPECT_NE(r.err.find("stopped by SIGTERM during probe"), std::string::npos) << r.err;
  EXPECT_FALSE(leftovers(dir.path()));
  EXPECT_TRUE(test::processesWithEnv(marker).empty());
}

TEST(PlanCli, TuneWritesTheFastestSettingItMeasuredAsAJobThatLoads) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("plan"));
  const auto r = test::cohort(
      with({"plan", job, "--tune", "--json", "--probe-steps", "4", "--output", dir.file("tuned.yaml"), "--set",
            "output.dir=" + dir.file("runs")},
           kGivenLink),
      {{"TMPDIR", dir.path()}});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const json p = json::parse(r.out);
  const json& tried = p["tune"]["tried"];
  ASSERT_GE(tried.size(), 3u);
  // The job as written comes first, every candidate keeps its global batch,
  // and the pick is the fastest of those that ran.
  const auto samples = [](const json& t) {
    return t["setting"]["ranks"].get<int>() * t["setting"]["batch_size"].get<int>() *
           t["setting"]["accumulate_steps"].get<int>();
  };
  EXPECT_EQ(tried[0]["setting"]["ranks"], 1);
  EXPECT_EQ(tried[0]["setting"]["batch_size"], 8);
  double fastest = 0;
  for (const auto& t : tried) {
    EXPECT_EQ(samples(t), 8) << t.dump();
    if (t["ran"].get<bool>()) fastest = std::max(fastest, t["measured"]["samples_per_s"].get<double>());
  }
  const json& best = tried[p["tune"]["best"].get<size_t>()];
  EXPECT_EQ(best["measured"]["samples_per_s"].get<double>(), fastest);
  EXPECT_GE(fastest, tried[0]["measured"]["samples_per_s"].get<double>());
  const std::string text = test::readText(dir.file("tuned.yaml"));
  EXPECT_EQ(text.rfind("# Written by `cohort plan --tune`", 0), 0u) << text;
  const auto v = test::cohort({"validate", dir.file("tuned.yaml")});
  ASSERT_EQ(v.exitCode, 0) << v.describe();
  EXPECT_NE(v.out.find("zero: " + std::to_string(best["setting"]["zero"].get<int>())), std::string::npos);
  EXPECT_NE(v.out.find("procs_per_node: " + std::to_string(best["setting"]["procs_per_node"].get<int>())),
            std::string::npos);
  EXPECT_FALSE(leftovers(dir.path()));
}

}  // namespace
}  // namespace cohort
