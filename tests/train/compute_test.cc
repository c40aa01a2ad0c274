// What a rank sets up before it computes (src/train/compute.cc) is what
// docs/performance.md says, and the allocator policy does what it is for.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/train/bind_cores.h"
#include "cohort/core/malloc_policy.h"
#include "cohort/train/compute.h"
#include "util/errors.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/runs.h"
#include "util/skip.h"

namespace cohort {
namespace {

long minorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Page faults taken by the second of two rounds of: allocate 64 MiB, write
// every page, free. Run in a child, so that each policy starts from glibc's
// defaults.
long faultsOfSecondRound(bool keep) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (keep && !keepFreedMemory()) _exit(3);
    constexpr size_t kBytes = 64u << 20;
    long faults = 0;
    for (int round = 0; round < 2; ++round) {
      const long before = minorFaults();
      auto* p = static_cast<volatile char*>(std::malloc(kBytes));
      if (p == nullptr) _exit(4);
      for (size_t i = 0; i < kBytes; i += 4096) p[i] = 1;
      std::free(const_cast<char*>(p));
      faults = minorFaults() - before;
    }
    const ssize_t n = write(fds[1], &faults, sizeof(faults));
    _exit(n == sizeof(faults) ? 0 : 5);
  }
  close(fds[1]);
  long faults = -1;
  if (read(fds[0], &faults, sizeof(faults)) != sizeof(faults)) faults = -1;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? faults : -1;
}

TEST(Compute, KeptMemoryIsReusedWithoutPageFaults) {
  constexpr long kPages = (64 << 20) / 4096;
  const long kept = faultsOfSecondRound(true);
  const long system = faultsOfSecondRound(false);
  ASSERT_GE(kept, 0);
  ASSERT_GE(system, 0);
  // glibc's default maps a block this large afresh each time: every page
  // faults again. This is what cost a rank half its speed on a machine
  // where a fault is expensive (docs/performance.md).
  EXPECT_GT(system, kPages / 2) << "the control does not fault: the test cannot tell";
  EXPECT_LT(kept, kPages / 20);
}

// The table of docs/performance.md between its markers: key -> value.
std::map<std::string, std::string> documentedDefaults() {
  const std::string doc = test::readText(test::sourceDir() + "/docs/performance.md");
  const std::string begin = "<!-- compute-defaults:begin -->", end = "<!-- compute-defaults:end -->";
  const auto b = doc.find(begin), e = doc.find(end);
  EXPECT_NE(b, std::string::npos);
  EXPECT_NE(e, std::string::npos);
  std::map<std::string, std::string> out;
  if (b == std::string::npos || e == std::string::npos) return out;
  const std::string table = doc.substr(b, e - b);
  // | `key` | `value` | explanation |
  const std::regex row(R"(\|\s*`([a-z_]+)`\s*\|\s*`([^`]*)`\s*\|)");
  for (std::sregex_iterator it(table.begin(), table.end(), row), stop; it != stop; ++it) {
    out[(*it)[1]] = (*it)[2];
  }
  return out;
}

nlohmann::json runCompute(const test::TempDir& dir, const std::string& tag, int procs,
                          const std::vector<std::string>& sets,
                          const std::map<std::string, std::string>& environment = {}) {
  const std::string job = dir.file(tag + ".yaml");
  test::writeText(job, test::tinyJobYaml(tag));
  std::vector<std::string> args = {"run", job, "--procs", std::to_string(procs), "--run-dir",
                                   dir.file(tag), "--set", "training.max_steps=2"};
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  const auto r = test::cohort(args, environment);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  std::ifstream in(dir.file(tag + "/summary.json"));
  if (!in) return nlohmann::json::object();
  return nlohmann::json::parse(in).value("compute", nlohmann::json::object());
}

TEST(Compute, StartUpStateIsTheDocumentedOne) {
  const auto documented = documentedDefaults();
  ASSERT_GE(documented.size(), 7u) << "docs/performance.md lost its table";
  test::TempDir dir;
  // The job's defaults, with memory_format auto (the tiny job fixes it).
  const nlohmann::json c = runCompute(dir, "defaults", 1, {"model.memory_format=auto"});
  ASSERT_FALSE(c.empty());
  for (const auto& [key, value] : documented) {
    ASSERT_TRUE(c.contains(key)) << "summary.json's compute has no " << key;
    if (key == "bind_cores") {
      // auto: bound exactly when one rank's one thread fills the cores.
      EXPECT_EQ(c[key], env::availableCores() == 1) << c.dump();
      EXPECT_FALSE(c["cores"].get<std::string>().empty()) << c.dump();
    } else if (key == "memory_format") {
      // Measured: either layout, with the times that decided it.
      EXPECT_TRUE(c[key] == "channels_last" || c[key] == "contiguous") << c.dump();
      EXPECT_EQ(c["memory_format_reason"].get<std::string>().rfind(value, 0), 0u) << c.dump();
    } else if (key == "conv_products") {
      // This job's model has no convolution the rule takes.
      EXPECT_EQ(c[key].get<std::string>().rfind(value, 0), 0u) << c.dump();
    } else if (key == "fused_ops") {
      // The widest build of the fused ops' loops this CPU runs.
      const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
      const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
      EXPECT_EQ(c[key], avx512 ? "avx512" : avx2 ? "avx2" : "off (no AVX2)") << c.dump();
    } else {
      EXPECT_EQ(c[key], nlohmann::json::parse(value)) << key << " in " << c.dump();
    }
  }
  EXPECT_FALSE(c["cpu"].get<std::string>().empty());
}

// A ResNet-18 on 8x8 images, batch 8, with memory_format auto: its
// convolutions the unfolded product's rule takes (layer2's downsample,
// layer3's three shapes) are timed both ways at start and the summary says
// how many went which way; with the memory format given nothing is timed.
TEST(Compute, AResNetsUnfoldedConvolutionsAreChosenByMeasurement) {
  test::TempDir dir;
  auto run = [&](const std::string& tag, const std::string& layout) {
    const std::string job = dir.file(tag + ".yaml");
    test::writeText(job, "name: " + tag + R"(
model: {arch: resnet18, num_classes: 4, small_input: true, memory_format: )" + layout + R"(}
data:
  train: {kind: synthetic, size: 16, shape: [3, 8, 8], seed: 3}
  loader_threads: 1
distribution: {procs_per_node: 1, threads_per_rank: 1, timeout_s: 60}
training: {epochs: 1, max_steps: 1, batch_size: 8, optimizer: {name: sgd, lr: 0.01}}
checkpoint: {enabled: false}
output: {progress: off, save_final: false}
)");
    const auto r = test::cohort({"run", job, "--procs", "1", "--run-dir", dir.file(tag)});
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    std::ifstream in(dir.file(tag + "/summary.json"));
    return in ? nlohmann::json::parse(in).value("compute", nlohmann::json::object()) : nlohmann::json::object();
  };
  const std::string measured = run("auto", "auto").value("conv_products", "");
  EXPECT_EQ(measured.rfind("measured: ", 0), 0u) << measured;
  EXPECT_NE(measured.find(" of 4 shapes unfolded"), std::string::npos) << measured;
  EXPECT_EQ(run("given", "channels_last").value("conv_products", ""),
            "the rule (model.memory_format is given: nothing measured)");
}

TEST(Compute, TheUsersOpenMpWaitPolicyIsKeptOverCohortsShortSpin) {
  test::TempDir dir;
  // The fork server and exec'd ranks (2 ranks: one of each path's kind of start).
  const nlohmann::json c = runCompute(dir, "passive", 2, {}, {{"OMP_WAIT_POLICY", "PASSIVE"}});
  EXPECT_EQ(c.value("openmp_wait", ""), "OMP_WAIT_POLICY=PASSIVE") << c.dump();
  const std::string log = test::readText(dir.file("passive/logs/rank-1.log"));
  EXPECT_NE(log.find("OpenMP wait OMP_WAIT_POLICY=PASSIVE;"), std::string::npos) << log;
  EXPECT_GE(c.value("load_average", -1.0), 0) << c.dump();
}

// COHORT_FUSED_OPS=off keeps the ATen ops, and the summary says so; a value
// other than auto or off is refused naming the variable.
TEST(Compute, CohortFusedOpsOffKeepsTheAtenOpsAndABadValueIsRefused) {
  test::TempDir dir;
  const nlohmann::json c = runCompute(dir, "unfused", 1, {}, {{"COHORT_FUSED_OPS", "off"}});
  EXPECT_EQ(c.value("fused_ops", ""), "off (COHORT_FUSED_OPS)") << c.dump();
  EXPECT_EQ(c.value("gemm", ""), "onednn") << c.dump();
  const std::string job = dir.file("bad.yaml");
  test::writeText(job, test::tinyJobYaml("bad"));
  const auto r = test::cohort({"run", job, "--procs", "1", "--run-dir", dir.file("bad"), "--set",
                               "training.max_steps=2"},
                              {{"COHORT_FUSED_OPS", "yes"}});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE((r.out + r.err).find("COHORT_FUSED_OPS must be auto or off, got 'yes'"), std::string::npos)
      << r.describe();
}

// COHORT_GEMM=aten holds linear layers to ATen's products, and the summary
// says so; a value other than auto or aten is refused naming the variable.
TEST(Compute, CohortGemmAtenKeepsAtensProductsAndABadValueIsRefused) {
  test::TempDir dir;
  const nlohmann::json c = runCompute(dir, "aten", 1, {}, {{"COHORT_GEMM", "aten"}});
  EXPECT_EQ(c.value("gemm", ""), "aten (COHORT_GEMM)") << c.dump();
  const std::string job = dir.file("bad.yaml");
  test::writeText(job, test::tinyJobYaml("bad"));
  const auto r = test::cohort({"run", job, "--procs", "1", "--run-dir", dir.file("bad"), "--set",
                               "training.max_steps=2"},
                              {{"COHORT_GEMM", "mkl"}});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE((r.out + r.err).find("COHORT_GEMM must be auto, aten or onednn-nt, got 'mkl'"), std::string::npos) << r.describe();
}

// The switches that run the older paths for comparisons (core/env.h):
// COHORT_ATTENTION=blas (the blockwise attention's float32 blocks through
// BLAS) and COHORT_GEMM=onednn-nt (every linear forward in oneDNN's (N, T)
// form) train a float32 GPT whose linear layers see 2304 rows to the same
// weights as the default paths, within float rounding; the summary names
// the linear form; a bad value is refused naming the variable and what it
// takes.
TEST(Compute, TheComparisonSwitchesTrainAsTheDefaultPathsDo) {
  test::TempDir dir;
  test::writeText(dir.file("corpus.txt"), test::corpus(60'000));
  const auto tok = test::cohort({"data", "tokenize", dir.file("corpus.txt"), dir.file("tok"), "--no-progress"});
  ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  // Heads of 32 over blocks of 64 positions, and sums of 64 and more terms:
  // long enough for the paths' orders of addition to differ.
  const std::string yaml = test::tinyTokenJobYaml("gpt", dir.file("tok/train"),
                                                  "{arch: gpt, n_layer: 2, n_head: 2, n_embd: 64, block_size: 64}");
  const std::vector<std::string> sets = {"training.precision=fp32", "training.batch_size=36", "training.max_steps=3"};
  // Every run holds OpenBLAS to its Haswell kernels, which sum a block's
  // products in another order than the tiles. OpenBLAS's own choice on a
  // CPU with avx512_bf16 (its Cooper Lake kernels) sums them in the tiles'
  // order, bitwise (seen on an AMD EPYC), which would hide whether the
  // switch took the other path. All runs alike: nothing else may differ.
  auto train = [&](const std::string& tag, std::map<std::string, std::string> env) {
    env["OPENBLAS_CORETYPE"] = "Haswell";
    const auto r = test::runJob(dir, tag, yaml, 1, sets, env);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return ckpt::readStateDict(dir.file(tag + "/model/final.pt"));
  };
  const ckpt::StateDict base = train("auto", {});
  // BLAS sums the attention's blocks in other orders than the tiles: not
  // bitwise the default's where the tiles run (the switch took another
  // path), within rounding of it.
  const double attention = test::maxDifference(base, train("blas", {{"COHORT_ATTENTION", "blas"}}));
  EXPECT_LT(attention, 1e-4);
  const char* held = std::getenv("ATEN_CPU_CAPABILITY");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      !(held != nullptr && std::string(held) == "default")) {
    EXPECT_GT(attention, 0) << "COHORT_ATTENTION=blas trained bitwise as the tiles: the switch changed nothing";
  }
  // oneDNN's two forms may sum alike (on an AVX-512 EPYC they gave the same
  // bits): within rounding, and the summary names the form.
  EXPECT_LT(test::maxDifference(base, train("nt", {{"COHORT_GEMM", "onednn-nt"}})), 1e-4);
  std::ifstream in(dir.file("nt/summary.json"));
  EXPECT_EQ(nlohmann::json::parse(in).at("compute").value("gemm", ""), "onednn, (N, T) forward (COHORT_GEMM)");
  const auto bad = test::runJob(dir, "bad", yaml, 1, sets, {{"COHORT_ATTENTION", "tiles"}});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_NE((bad.out + bad.err).find("COHORT_ATTENTION must be auto, matmul or blas, got 'tiles'"), std::string::npos)
      << bad.describe();
}

TEST(Compute, TheJobFileOverridesEveryChoice) {
  test::TempDir dir;
  const nlohmann::json c =
      runCompute(dir, "overrides", 2,
                 {"compute.allocator=system", "compute.onednn=off", "model.memory_format=contiguous",
                  "distribution.threads_per_rank=2"});
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c["allocator"], "system");
  EXPECT_EQ(c["onednn"], false);
  EXPECT_EQ(c["gemm"], "aten (compute.onednn off)");
  EXPECT_EQ(c["memory_format"], "contiguous");
  EXPECT_EQ(c["memory_format_reason"], "model.memory_format");
  EXPECT_EQ(c["intra_op_threads"], 2);
  // Every rank logs the same state (rank 1's log is its own process's).
  const std::string log = test::readText(dir.file("overrides/logs/rank-1.log"));
  EXPECT_NE(log.find("allocator system (glibc); oneDNN off;"), std::string::npos) << log;
  EXPECT_NE(log.find("memory format contiguous"), std::string::npos) << log;
}

TEST(Compute, RanksAgreeOnAMeasuredLayout) {
  test::TempDir dir;
  const nlohmann::json c = runCompute(dir, "measured", 2, {"model.memory_format=auto"});
  ASSERT_FALSE(c.empty());
  const std::string chosen = c["memory_format"];
  const std::string log = test::readText(dir.file("measured/logs/rank-1.log"));
  EXPECT_NE(log.find("memory format " + chosen + " (measured:"), std::string::npos) << log;
  EXPECT_NE(log.find(" per pass, mean of 2 ranks)"), std::string::npos) << log;
}

TEST(BindCores, EachLocalRankTakesItsSliceWhenTheyFit) {
  using train::coresOfRank;
  const std::vector<int> four{0, 1, 2, 3}, odd{1, 3, 5, 7};
  // auto: only when the ranks' threads fill the cores exactly.
  EXPECT_EQ(coresOfRank(BindCores::automatic, four, 0, 2, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(coresOfRank(BindCores::automatic, four, 1, 2, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(coresOfRank(BindCores::automatic, odd, 3, 4, 1), (std::vector<int>{7}));
  EXPECT_TRUE(coresOfRank(BindCores::automatic, four, 0, 2, 1).empty()) << "spare cores: none bound";
  EXPECT_TRUE(coresOfRank(BindCores::automatic, four, 0, 2, 4).empty()) << "oversubscribed: none bound";
  // on: whenever they fit, and refused when they do not.
  EXPECT_EQ(coresOfRank(BindCores::on, odd, 1, 2, 1), (std::vector<int>{3}));
  const std::string refused = test::errorOf<ConfigError>([&] { coresOfRank(BindCores::on, four, 0, 3, 2); });
  for (const char* part : {"compute.bind_cores", "need 6 cores", "0-3"}) {
    EXPECT_NE(refused.find(part), std::string::npos) << refused;
  }
  EXPECT_TRUE(coresOfRank(BindCores::off, four, 0, 4, 1).empty());
  EXPECT_EQ(train::describeCores({0, 1, 2, 3, 6, 8, 9}), "0-3,6,8-9");
  EXPECT_EQ(train::describeCores({}), "");
}

// Two ranks of one thread each, bound: each reports (and its log names)
// the one core it now runs on, read back from the kernel.
TEST(BindCores, RanksOfARunAreHeldToCoresOfTheirOwn) {
  const std::vector<int> allowed = train::allowedCores();
  if (allowed.size() < 2) COHORT_SKIP("one core: nothing to bind two ranks to");
  test::TempDir dir;
  const nlohmann::json c =
      runCompute(dir, "bound", 2, {"compute.bind_cores=on", "distribution.threads_per_rank=1"});
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c["bind_cores"], true);
  EXPECT_EQ(c["cores"], std::to_string(allowed[0]));
  const std::string log = test::readText(dir.file("bound/logs/rank-1.log"));
  EXPECT_NE(log.find(fmt::format("cores {} (bound)", allowed[1])), std::string::npos) << log;
  const nlohmann::json off = runCompute(dir, "unbound", 2, {"compute.bind_cores=off"});
  EXPECT_EQ(off["bind_cores"], false);
  EXPECT_EQ(off["cores"], train::describeCores(allowed));
}

TEST(Compute, OnednnOnIsRefusedOnlyWithoutOnednn) {
  JobConfig job;
  job.compute.onednn = OneDnn::on;
  job.distribution.threadsPerRank = 1;
  job.compute.allocator = Allocator::system;
  if (at::hasMKLDNN()) {
    EXPECT_NO_THROW(train::applyCompute(job, 1));
    EXPECT_TRUE(train::observeCompute().onednn);
    job.compute.onednn = OneDnn::off;
    train::applyCompute(job, 1);
    EXPECT_FALSE(train::observeCompute().onednn);
  } else {
    EXPECT_THROW(train::applyCompute(job, 1), ConfigError);
  }
}

}  // namespace
}  // namespace cohort
