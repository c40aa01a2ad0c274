// Health checks: `cohort health` on real rank processes, the preflight with
// ranks as threads, and the measurements and reports on their own. Nothing
// here asserts a speed (the machine is shared): only that every figure is
// measured and that pass and fail follow the thresholds.

#include "cohort/health/health.h"

#include <stdlib.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "cohort/comm/comm.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/health/ceiling.h"
#include "util/jobs.h"
#include "util/rank_threads.h"

namespace cohort {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> kChecks = {"matmul", "memory", "disk", "allreduce"};

nlohmann::json parseReports(const test::ProcessResult& r) {
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_TRUE(j.is_array()) << r.describe();
  return j.is_array() ? j : nlohmann::json::array();
}

bool dirIsEmpty(const std::string& dir) {
  return std::filesystem::is_empty(std::filesystem::path(dir));
}

TEST(HealthCli, TwoRanksMeasureEveryCheckAndPassTheDefaults) {
  test::TempDir dir;
  auto r = test::cohort({"health", "--procs", "2", "--json", "--set",
                         "health.disk_dir=" + dir.path()},
                        {}, 3min);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto reports = parseReports(r);
  ASSERT_EQ(reports.size(), 2u) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    const auto& rep = reports[static_cast<size_t>(rank)];
    EXPECT_EQ(rep.at("rank").get<int>(), rank);
    EXPECT_EQ(rep.at("world_size").get<int>(), 2);
    EXPECT_FALSE(rep.at("host").get<std::string>().empty());
    EXPECT_GE(rep.at("threads").get<int>(), 1);
    EXPECT_TRUE(rep.at("passed").get<bool>()) << rep.dump(2);
    for (const auto& name : kChecks) {
      ASSERT_TRUE(rep.at("checks").contains(name)) << name << "\n" << rep.dump(2);
      const auto& c = rep.at("checks").at(name);
      EXPECT_GT(c.at("value").get<double>(), 0) << name << "\n" << c.dump(2);
      EXPECT_GT(c.at("threshold").get<double>(), 0) << name << ": defaults are enforced";
      EXPECT_EQ(c.at("status").get<std::string>(), "pass") << name << "\n" << c.dump(2);
      EXPECT_TRUE(c.at("passed").get<bool>());
      EXPECT_EQ(c.at("key").get<std::string>().rfind("health.min_", 0), 0u) << c.dump();
      EXPECT_FALSE(c.at("unit").get<std::string>().empty());
      EXPECT_FALSE(c.contains("error")) << c.dump(2);
    }
  }
  EXPECT_TRUE(dirIsEmpty(dir.path())) << "the disk check removes its file";
}

TEST(HealthCli, ImpossibleThresholdFailsNamingTheRanksAndTheCheck) {
  test::TempDir dir;
  auto r = test::cohort({"health", "--procs", "2", "--set", "health.min_matmul_gflops=1e9",
                         "--set", "health.disk_dir=" + dir.path()},
                        {}, 3min);
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("health checks failed on 2 of 2 ranks [0, 1]"), std::string::npos) << r.err;
  for (const char* rank : {"rank 0 (host ", "rank 1 (host "}) {
    EXPECT_NE(r.err.find(rank), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("GFLOP/s is below health.min_matmul_gflops = 1e+09"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("memory"), std::string::npos) << "only the failing check\n" << r.err;
  // The table on stdout marks the failing cells.
  EXPECT_NE(r.out.find("matmul GFLOP/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" FAIL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAILED"), std::string::npos) << r.out;
}

TEST(HealthCli, UnwritableDiskDirFailsTheDiskCheckNamingThePath) {
  test::TempDir dir;
  test::writeText(dir.file("plain-file"), "not a directory\n");
  const std::string bad = dir.file("plain-file") + "/sub";
  auto r = test::cohort({"health", "--json", "--set", "health.disk_dir=" + bad}, {}, 2min);
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  const auto reports = parseReports(r);
  ASSERT_EQ(reports.size(), 1u) << "one rank without a job";
  const auto& checks = reports[0].at("checks");
  EXPECT_EQ(checks.at("disk").at("status"), "fail");
  EXPECT_NE(checks.at("disk").at("error").get<std::string>().find(bad), std::string::npos)
      << checks.dump(2);
  for (const char* other : {"matmul", "memory"}) EXPECT_EQ(checks.at(other).at("status"), "pass");
  EXPECT_EQ(checks.at("allreduce").at("status"), "skipped") << "one rank";
  EXPECT_TRUE(checks.at("allreduce").at("passed").get<bool>());
  EXPECT_NE(r.err.find("rank 0 (host "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("disk: cannot create " + bad + "/.cohort-health-"), std::string::npos)
      << r.err;
}

TEST(HealthCli, RanksComeFromTheJobAndBadInputExitsTwo) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("health"));
  auto r = test::cohort({"health", job, "--json", "--set", "distribution.procs_per_node=2",
                         "--set", "health.disk_dir=" + dir.path(), "--set",
                         "health.seconds_per_check=0.1"},
                        {}, 3min);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(parseReports(r).size(), 2u) << r.out;

  auto typo = test::cohort({"health", "--set", "health.min_matmul_gflop=5"});
  EXPECT_EQ(typo.exitCode, 2) << typo.describe();
  EXPECT_NE(typo.err.find("did you mean 'min_matmul_gflops'"), std::string::npos) << typo.err;
  auto negative = test::cohort({"health", "--set", "health.min_disk_write_mbps=-1"});
  EXPECT_EQ(negative.exitCode, 2) << negative.describe();
  EXPECT_NE(negative.err.find("health.min_disk_write_mbps: must be >= 0"), std::string::npos)
      << negative.err;
  EXPECT_EQ(test::cohort({"health", "--procs", "0"}).exitCode, 2);
  EXPECT_EQ(test::cohort({"health", dir.file("missing.yaml")}).exitCode, 2);
}

TEST(HealthPreflight, EveryRankThrowsTheSameErrorNamingEachFailingRank) {
  test::TempDir dir;
  HealthConfig cfg;
  cfg.minMatmulGflops = 1e9;
  cfg.secondsPerCheck = 0.05;
  cfg.memoryMb = 16;
  cfg.diskMb = 4;
  std::vector<std::string> errors(2);
  test::withRankThreads(2, "health-test", [&](const comm::Comm& c) {
    try {
      health::preflight(c, cfg, dir.path());
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank)] = e.what();
    }
  });
  ASSERT_FALSE(errors[0].empty()) << "preflight passed an impossible threshold";
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_NE(errors[0].find("rank 0 (host "), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 1 (host "), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("matmul"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("distribution.preflight"), std::string::npos) << errors[0];
  EXPECT_TRUE(dirIsEmpty(dir.path()));
}

TEST(HealthPreflight, PassingChecksReturnEveryRanksReport) {
  test::TempDir dir;
  HealthConfig cfg;
  cfg.secondsPerCheck = 0.05;
  cfg.memoryMb = 16;
  cfg.diskMb = 4;
  // Thresholds off: only the plumbing is under test here.
  cfg.minMatmulGflops = cfg.minMemoryGbps = cfg.minDiskWriteMbps = cfg.minAllreduceBusbwGbps = 0;
  std::vector<std::vector<health::HealthReport>> got(2);
  test::withRankThreads(2, "health-test", [&](const comm::Comm& c) {
    // Twice: each call pairs with the same call of the other rank.
    health::preflight(c, cfg, dir.path());
    got[static_cast<size_t>(c.rank)] = health::preflight(c, cfg, dir.path());
  });
  for (const auto& reports : got) {
    ASSERT_EQ(reports.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(reports[static_cast<size_t>(r)].rank, r);
      EXPECT_TRUE(reports[static_cast<size_t>(r)].passed());
      ASSERT_NE(reports[static_cast<size_t>(r)].find("allreduce"), nullptr);
      EXPECT_GT(reports[static_cast<size_t>(r)].find("allreduce")->value, 0);
    }
  }
  EXPECT_EQ(health::healthReportsJson(got[0]), health::healthReportsJson(got[1]));
}

TEST(HealthMeasure, EachMeasurementIsPositive) {
  test::TempDir dir;
  EXPECT_GT(health::measureMatmulGflops(64, 0.01), 0);
  EXPECT_GT(health::measureMemoryGbps(size_t{1} << 20, 0.01), 0);
  std::string method;
  // 5 MiB: whole 4 MiB blocks and a tail that is not one.
  EXPECT_GT(health::measureDiskWriteMbps(dir.path(), (size_t{5} << 20) + 100, 5, &method), 0);
  EXPECT_TRUE(method == "O_DIRECT" || method == "buffered") << method;
  EXPECT_TRUE(dirIsEmpty(dir.path()));
}

// COHORT_CACHE_DIR for one test, restored after it.
class CacheDir {
 public:
  explicit CacheDir(const std::string& dir) {
    if (const char* old = std::getenv("COHORT_CACHE_DIR")) old_ = old;
    setenv("COHORT_CACHE_DIR", dir.c_str(), 1);
  }
  ~CacheDir() {
    if (old_.empty()) {
      unsetenv("COHORT_CACHE_DIR");
    } else {
      setenv("COHORT_CACHE_DIR", old_.c_str(), 1);
    }
  }

 private:
  std::string old_;
};

// Rewrites the cache file's one entry with `gflops`.
void setCachedGflops(const std::string& file, double gflops) {
  auto j = nlohmann::json::parse(readFile(file));
  ASSERT_EQ(j.at("entries").size(), 1u) << j.dump(2);
  j["entries"][0]["gflops"] = gflops;
  writeFileAtomic(file, j.dump());
}

TEST(HealthCeiling, MeasuredOnceThenReadFromTheMachinesCache) {
  test::TempDir dir;
  CacheDir cache(dir.path() + "/cache");
  EXPECT_EQ(health::ceilingCacheFile(), dir.path() + "/cache/gemm-ceiling.json");
  EXPECT_FALSE(health::gemmCeiling("float32", 1, health::Measure::no).has_value()) << "nothing cached yet";
  // A busy machine's measurement serves the caller and is not kept.
  const auto busy = health::gemmCeiling("float32", 1, health::Measure::once, 0.05);
  ASSERT_TRUE(busy.has_value());
  EXPECT_TRUE(busy->busy);
  EXPECT_GT(busy->gflops, 0);
  EXPECT_FALSE(std::filesystem::exists(health::ceilingCacheFile()));
  const auto first = health::gemmCeiling("float32", 1, health::Measure::keep, 0.05);
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(first->cached);
  EXPECT_GT(first->gflops, 0);
  EXPECT_EQ(first->n, 1024);
  EXPECT_TRUE(first->library == "torch::mm" || first->library == "oneDNN sgemm") << first->library;
  EXPECT_FALSE(first->measuredAt.empty());
  ASSERT_TRUE(std::filesystem::exists(first->file));
  const auto again = health::gemmCeiling("float32", 1, health::Measure::no);
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->cached);
  EXPECT_EQ(again->gflops, first->gflops);
  EXPECT_EQ(again->measuredAt, first->measuredAt);
  EXPECT_EQ(again->library, first->library);
  // Another thread count or dtype is another entry.
  EXPECT_FALSE(health::gemmCeiling("float32", 3, health::Measure::no).has_value());
  EXPECT_FALSE(health::gemmCeiling("bfloat16", 1, health::Measure::no).has_value());
}

TEST(HealthCeiling, AMeasurementReplacesTheCachedOneOnlyWhenHigher) {
  test::TempDir dir;
  CacheDir cache(dir.path());
  const auto first = health::gemmCeiling("float32", 1, health::Measure::keep, 0.05);
  ASSERT_TRUE(first.has_value());
  setCachedGflops(first->file, 1e-6);  // as if measured on a very busy machine
  const health::GemmCeiling raised = health::remeasureGemmCeiling("float32", 1, 0.05);
  EXPECT_GT(raised.gflops, 1e-6);
  EXPECT_EQ(health::gemmCeiling("float32", 1, health::Measure::no)->gflops, raised.gflops);
  setCachedGflops(first->file, 1e9);
  EXPECT_EQ(health::remeasureGemmCeiling("float32", 1, 0.05).gflops, 1e9) << "a lower measurement is not kept";
  EXPECT_EQ(health::gemmCeiling("float32", 1, health::Measure::no)->gflops, 1e9);
}

// An entry an older cohort wrote measured torch::mm alone (no "products"):
// it is not read, and the next measurement replaces it.
TEST(HealthCeiling, AnEntryOfTorchMmAloneIsMeasuredAgain) {
  test::TempDir dir;
  CacheDir cache(dir.path());
  const auto first = health::gemmCeiling("float32", 1, health::Measure::keep, 0.05);
  ASSERT_TRUE(first.has_value());
  auto j = nlohmann::json::parse(readFile(first->file));
  EXPECT_EQ(j["entries"][0].at("products"), "torch::mm, oneDNN sgemm");
  j["entries"][0].erase("products");
  j["entries"][0].erase("library");
  writeFileAtomic(first->file, j.dump());
  EXPECT_FALSE(health::gemmCeiling("float32", 1, health::Measure::no).has_value());
  ASSERT_TRUE(health::gemmCeiling("float32", 1, health::Measure::keep, 0.05).has_value());
  EXPECT_EQ(nlohmann::json::parse(readFile(first->file)).at("entries").size(), 1u) << "the old entry was replaced";
}

// A ceiling measured with the kernels held to a narrower instruction set
// (ONEDNN_MAX_CPU_ISA and the like) is another entry: utilization under a
// hold is against what the held kernels reach. (oneDNN reads the variable
// once per process, so what is checked here is the cache's key; the
// benchmarks' --isa runs measure under the hold in their own processes.)
TEST(HealthCeiling, AnInstructionSetHoldIsAnotherEntry) {
  test::TempDir dir;
  CacheDir cache(dir.path());
  const char* names[] = {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OPENBLAS_CORETYPE"};
  std::vector<std::optional<std::string>> saved;
  for (const char* n : names) {
    const char* v = std::getenv(n);
    saved.push_back(v ? std::optional<std::string>(v) : std::nullopt);
    unsetenv(n);
  }
  const auto unheld = health::gemmCeiling("float32", 1, health::Measure::keep, 0.05);
  ASSERT_TRUE(unheld.has_value());
  EXPECT_EQ(unheld->holds, "");
  setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  EXPECT_EQ(env::instructionSetHolds(), "ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell");
  EXPECT_FALSE(health::gemmCeiling("float32", 1, health::Measure::no).has_value()) << "the unheld entry served";
  const auto held = health::gemmCeiling("float32", 1, health::Measure::keep, 0.05);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->holds, "ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell");
  EXPECT_NE(health::describe(*held).find("held: ONEDNN_MAX_CPU_ISA=AVX2"), std::string::npos)
      << health::describe(*held);
  const auto j = nlohmann::json::parse(readFile(held->file));
  EXPECT_EQ(j.at("entries").size(), 2u) << j.dump(2);
  unsetenv("ONEDNN_MAX_CPU_ISA");
  unsetenv("OPENBLAS_CORETYPE");
  const auto again = health::gemmCeiling("float32", 1, health::Measure::no);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->measuredAt, unheld->measuredAt);
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i]) setenv(names[i], saved[i]->c_str(), 1);
  }
}

TEST(HealthCeiling, ACacheFileCohortCannotReadIsMeasuredAgainAndReplaced) {
  test::TempDir dir;
  CacheDir cache(dir.path());
  writeFileAtomic(health::ceilingCacheFile(), "{not json");
  EXPECT_FALSE(health::gemmCeiling("float32", 1, health::Measure::no).has_value());
  const auto c = health::gemmCeiling("float32", 1, health::Measure::keep, 0.05);
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->cached);
  const auto j = nlohmann::json::parse(readFile(health::ceilingCacheFile()), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j.at("entries").size(), 1u);
}

TEST(HealthCli, TheTablePrintsTheGemmCeilingAndKeepsIt) {
  test::TempDir dir;
  auto r = test::cohort({"health", "--procs", "1", "--set", "health.disk_dir=" + dir.path(), "--set",
                         "distribution.threads_per_rank=1"},
                        {{"COHORT_CACHE_DIR", dir.path() + "/cache"}}, 3min);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.out.find("GEMM ceiling: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("float32 x 1 thread"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(dir.path() + "/cache/gemm-ceiling.json"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(readFile(dir.path() + "/cache/gemm-ceiling.json"));
  EXPECT_GE(j.at("entries").size(), 1u);
  EXPECT_EQ(j["entries"][0].at("dtype"), "float32");
  EXPECT_GT(j["entries"][0].at("gflops").get<double>(), 0);
}

// With oneDNN held to AVX2, which has no bf16 kernels, the bfloat16
// ceiling (measured where the CPU has avx512_bf16 or AMX) is LibTorch's own
// product, as training's bf16 is there, and not a failed oneDNN primitive;
// both ceilings name the hold.
TEST(HealthCli, UnderAnAvx2HoldTheCeilingsAreMeasuredAndNameTheHold) {
  test::TempDir dir;
  auto r = test::cohort({"health", "--procs", "1", "--set", "health.disk_dir=" + dir.path(), "--set",
                         "distribution.threads_per_rank=1"},
                        {{"COHORT_CACHE_DIR", dir.path() + "/cache"}, {"ONEDNN_MAX_CPU_ISA", "AVX2"},
                         {"ATEN_CPU_CAPABILITY", "avx2"}},
                        3min);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.out.find("float32 x 1 thread"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("held: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(readFile(dir.path() + "/cache/gemm-ceiling.json"));
  for (const auto& e : j.at("entries")) {
    EXPECT_NE(e.value("holds", "").find("ONEDNN_MAX_CPU_ISA=AVX2"), std::string::npos) << e.dump();
    EXPECT_GT(e.value("gflops", 0.0), 0) << e.dump();
  }
}

TEST(HealthMeasure, DiskErrorNamesThePath) {
  test::TempDir dir;
  try {
    health::measureDiskWriteMbps(dir.file("nope"), 1 << 20, 1);
    FAIL() << "wrote into a directory that does not exist";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("nope") + "/.cohort-health-"), std::string::npos)
        << e.what();
  }
}

health::HealthReport fakeReport(int rank, double matmul, double threshold) {
  health::HealthReport r;
  r.rank = rank;
  r.worldSize = 2;
  r.host = "node" + std::to_string(rank);
  health::HealthCheck c;
  c.name = "matmul";
  c.unit = "GFLOP/s";
  c.key = "health.min_matmul_gflops";
  c.value = matmul;
  c.threshold = threshold;
  c.status = matmul >= threshold ? health::CheckStatus::pass : health::CheckStatus::fail;
  r.checks.push_back(c);
  health::HealthCheck d;
  d.name = "disk";
  d.unit = "MB/s";
  d.key = "health.min_disk_write_mbps";
  d.threshold = 20;
  d.status = health::CheckStatus::fail;
  d.error = "cannot create /x/.cohort-health: Permission denied";
  if (rank == 0) r.checks.push_back(d);
  return r;
}

TEST(HealthReport, FailuresNameRankHostCheckMeasuredAndThreshold) {
  const std::vector<health::HealthReport> reports = {fakeReport(0, 50, 10),
                                                      fakeReport(1, 3.25, 10)};
  EXPECT_EQ(health::healthFailures(reports),
            "health checks failed on 2 of 2 ranks [0, 1]: rank 0 (host node0): disk: cannot "
            "create /x/.cohort-health: Permission denied; rank 1 (host node1): matmul 3.25 "
            "GFLOP/s is below health.min_matmul_gflops = 10");
  EXPECT_EQ(health::healthFailures({fakeReport(1, 50, 10)}), "") << "rank 1 passes at 50";
  const std::string table = health::formatHealthTable(reports);
  EXPECT_NE(table.find("50 ok"), std::string::npos) << table;
  EXPECT_NE(table.find("3.25 FAIL"), std::string::npos) << table;
  EXPECT_NE(table.find("ERROR"), std::string::npos) << table;
  const auto j = nlohmann::json::parse(health::healthReportsJson(reports));
  EXPECT_EQ(j[1]["checks"]["matmul"]["status"], "fail");
  EXPECT_FALSE(j[1]["passed"].get<bool>());
  EXPECT_EQ(j[0]["checks"]["disk"]["error"], "cannot create /x/.cohort-health: Permission denied");
}

// distribution.preflight in `cohort run`: a failing check stops the job
// before training, naming the rank and the check, and is not restarted; a
// passing one logs the table and training goes on.
TEST(HealthPreflight, AFailingCheckStopsTheRunBeforeTraining) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("preflight"));
  auto r = test::cohort({"run", dir.file("job.yaml"), "--procs", "2", "--run-dir",
                         dir.file("run"), "--set", "distribution.preflight=true", "--set",
                         "health.min_matmul_gflops=1e9", "--set", "health.seconds_per_check=0.05",
                         "--set", "distribution.max_restarts=2"},
                        {}, 3min);
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("exited with code 5"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart 1 of"), std::string::npos) << "a failed preflight was restarted";
  const std::string log0 = test::readText(dir.file("run/logs/rank-0.log"));
  EXPECT_NE(log0.find("rank 1 (host "), std::string::npos) << log0;
  EXPECT_NE(log0.find("matmul"), std::string::npos) << log0;
  for (const auto& j : test::readJsonLines(dir.file("run/metrics.jsonl"))) {
    EXPECT_NE(j.value("event", ""), "train") << "training started: " << j.dump();
  }
}

TEST(HealthPreflight, PassingChecksLetTheRunTrain) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("preflight"));
  // Every check runs, against minimums any machine meets even while the
  // rest of the suite loads it (the defaults failed once under ctest -j2).
  auto r = test::cohort({"run", dir.file("job.yaml"), "--procs", "2", "--run-dir",
                         dir.file("run"), "--set", "distribution.preflight=true", "--set",
                         "health.seconds_per_check=0.05", "--set", "health.min_matmul_gflops=0.01",
                         "--set", "health.min_memory_gbps=0.01", "--set",
                         "health.min_disk_write_mbps=0.1", "--set",
                         "health.min_allreduce_busbw_gbps=0.0001"},
                        {}, 3min);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string log0 = test::readText(dir.file("run/logs/rank-0.log"));
  EXPECT_NE(log0.find("allreduce"), std::string::npos) << "no health table in the log:\n" << log0;
}

}  // namespace
}  // namespace cohort
