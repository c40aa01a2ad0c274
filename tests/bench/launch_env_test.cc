// The benchmarks' own check that both sides of a comparison run alike
// (bench/launch_env.py, docs/benchmarks.md): started with the environment
// launch_env.py gives for an allocator and a thread count (or through its
// `run`), the PyTorch peers (ddp.py, gpt.py, step.py, fashion_mnist.py,
// asked only for their report) and a real cohort
// run report the same allocator serving malloc and the same intra- and
// inter-op threads; a peer started otherwise (the preload missing, another
// thread count) exits 3 naming the setting, so the benchmark fails instead
// of printing a figure. Real processes; nothing is timed.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cohort/core/env.h"
#include "test_paths.h"
#include "launch_env.h"
#include "util/jobs.h"
#include "util/process.h"

namespace cohort {
namespace {

std::string script(const std::string& name) { return test::sourceDir() + "/bench/" + name; }

// launch_env.py's variables for `allocator` and `threads`.
std::map<std::string, std::string> environmentFor(const std::string& allocator, int threads) {
  const auto r = test::run({COHORT_PYTHON, script("launch_env.py"), "env", allocator, std::to_string(threads)});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  std::map<std::string, std::string> env;
  if (r.exitCode != 0) return env;
  const nlohmann::json vars = nlohmann::json::parse(r.out);
  for (auto it = vars.begin(); it != vars.end(); ++it) env[it.key()] = it.value().get<std::string>();
  return env;
}

// The "launch" report of a peer's JSON line; null when it failed.
nlohmann::json peerReport(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  const auto r = test::run(argv, env, std::chrono::minutes(3));
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  const auto at = r.out.rfind("{\"peer\"");
  if (r.exitCode != 0 || at == std::string::npos) return nullptr;
  return nlohmann::json::parse(r.out.substr(at)).value("launch", nlohmann::json());
}

std::vector<std::vector<std::string>> peers(int threads) {
  const std::string t = std::to_string(threads);
  return {{COHORT_PYTHON, script("peers/ddp.py"), "--report-only", "--world", "2", "--threads", t},
          {COHORT_PYTHON, script("peers/gpt.py"), "ddp", "--report-only", "--threads", t},
          {COHORT_PYTHON, script("peers/step.py"), "--report-only", "--threads", t},
          {COHORT_PYTHON, script("peers/fashion_mnist.py"), "--report-only", "--threads", t}};
}

class LaunchEnv : public ::testing::TestWithParam<std::pair<std::string, int>> {};

TEST_P(LaunchEnv, EverySideReportsTheAllocatorAndThreadsItWasStartedWith) {
  const auto [allocator, threads] = GetParam();
  const auto env = environmentFor(allocator, threads);
  ASSERT_FALSE(env.empty());
  for (const auto& argv : peers(threads)) {
    SCOPED_TRACE(argv[1]);
    const nlohmann::json launch = peerReport(argv, env);
    ASSERT_TRUE(launch.is_object());
    EXPECT_EQ(launch["malloc"], allocator) << launch.dump();
    EXPECT_EQ(launch["intra_op_threads"], threads) << launch.dump();
    EXPECT_EQ(launch["inter_op_threads"], 1) << launch.dump();
  }
  // `launch_env.py run` (what scripts/bench.sh starts a side with) gives
  // the same from an environment without them.
  {
    const nlohmann::json launch =
        peerReport({COHORT_PYTHON, script("launch_env.py"), "run", allocator, std::to_string(threads), COHORT_PYTHON,
                    script("peers/fashion_mnist.py"), "--report-only", "--threads", std::to_string(threads)},
                   {{"LD_PRELOAD", ""}, {"OMP_NUM_THREADS", ""}, {"COHORT_BENCH_EXPECT", ""}});
    ASSERT_TRUE(launch.is_object());
    EXPECT_EQ(launch["malloc"], allocator) << launch.dump();
    EXPECT_EQ(launch["intra_op_threads"], threads) << launch.dump();
  }
  // cohort's side, 2 ranks: summary.json's compute says the same.
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("launch"));
  const auto r = test::cohort({"run", job, "--procs", "2", "--run-dir", dir.file("run"), "--set",
                               "training.max_steps=2", "--set",
                               "distribution.threads_per_rank=" + std::to_string(threads)},
                              env);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  std::ifstream in(dir.file("run/summary.json"));
  const nlohmann::json compute = nlohmann::json::parse(in).value("compute", nlohmann::json::object());
  EXPECT_EQ(compute["malloc"], allocator) << compute.dump();
  EXPECT_EQ(compute["intra_op_threads"], threads) << compute.dump();
  EXPECT_EQ(compute["inter_op_threads"], 1) << compute.dump();
  // Cores bound alike: cohort's 2 ranks (compute.bind_cores: auto) and the
  // DDP peer's 2 ranks, each rank 0 on the same slice, when the ranks'
  // threads fill the cores; neither otherwise.
  const bool fill = 2 * threads == env::availableCores();
  EXPECT_EQ(compute["bind_cores"], fill) << compute.dump();
  const nlohmann::json ddpPeer = peerReport(peers(threads)[0], env);
  ASSERT_TRUE(ddpPeer.is_object());
  EXPECT_EQ(ddpPeer["bind_cores"], fill) << ddpPeer.dump();
  EXPECT_EQ(ddpPeer["cores"], compute["cores"]) << ddpPeer.dump() << "\n" << compute.dump();
}

INSTANTIATE_TEST_SUITE_P(Allocators, LaunchEnv,
                         ::testing::Values(std::pair{std::string("glibc"), 1}, std::pair{std::string("tcmalloc"), 2},
                                           std::pair{std::string("jemalloc"), 1}),
                         [](const auto& info) { return info.param.first; });

TEST(LaunchEnvCheck, APeerStartedOtherwiseExits3NamingTheSetting) {
  // The preload taken away from what the harness says.
  auto env = environmentFor("tcmalloc", 1);
  ASSERT_FALSE(env.empty());
  env["LD_PRELOAD"] = "";
  for (const auto& argv : peers(1)) {
    const auto r = test::run(argv, env, std::chrono::minutes(3));
    EXPECT_NE(r.exitCode, 0) << r.describe();
    EXPECT_NE(r.err.find("malloc is 'glibc', the benchmark expects 'tcmalloc'"), std::string::npos)
        << r.describe();
    EXPECT_EQ(r.out.find("{\"peer\""), std::string::npos) << "a report despite the difference";
  }
  // Another thread count than the harness says.
  const auto two = environmentFor("glibc", 2);
  for (const auto& argv : peers(1)) {
    const auto r = test::run(argv, two, std::chrono::minutes(3));
    EXPECT_NE(r.exitCode, 0) << r.describe();
    EXPECT_NE(r.err.find("intra_op_threads is 1, the benchmark expects 2"), std::string::npos) << r.describe();
  }
  // Left unbound where the harness binds: the benchmark's own check of
  // the two sides refuses the pair.
  {
    nlohmann::json cohortSide = {{"malloc", "tcmalloc"}, {"intra_op_threads", 1}, {"inter_op_threads", 1},
                                 {"bind_cores", true}};
    nlohmann::json peer = cohortSide;
    peer["bind_cores"] = false;
    try {
      bench::requireSameLaunch(cohortSide, peer, "resnet18 2 ranks");
      ADD_FAILURE() << "a peer bound otherwise was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("bind_cores true (cohort) against false (peer)"), std::string::npos)
          << e.what();
    }
    peer.erase("bind_cores");  // an untuned peer (no binding asked of it): not compared
    EXPECT_NO_THROW(bench::requireSameLaunch(cohortSide, peer, "untuned"));
  }
  // An allocator launch_env.py does not know.
  const auto bad = test::run({COHORT_PYTHON, script("launch_env.py"), "env", "mimalloc", "1"});
  EXPECT_NE(bad.exitCode, 0);
  EXPECT_NE(bad.err.find("allocator 'mimalloc'"), std::string::npos) << bad.describe();
}

// --isa: "native" removes what would hold a library below the CPU (an
// OPENBLAS_CORETYPE=Haswell a machine's environment left there), "avx2"
// holds every library, "env" keeps what is set, anything else is refused.
TEST(BenchIsa, NativeRemovesTheHoldsAvx2SetsThemEnvKeepsThem) {
  std::map<std::string, std::string> saved;
  for (const char* v : bench::kIsaVariables) {
    if (const char* value = std::getenv(v)) saved[v] = value;
  }
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  EXPECT_NE(bench::applyIsa("env").find("OPENBLAS_CORETYPE=Haswell"), std::string::npos);
  EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), "Haswell");
  const std::string native = bench::applyIsa("native");
  EXPECT_NE(native.find("removed from the environment: OPENBLAS_CORETYPE=Haswell"), std::string::npos) << native;
  for (const char* v : bench::kIsaVariables) EXPECT_EQ(std::getenv(v), nullptr) << v;
  bench::applyIsa("avx2");
  EXPECT_STREQ(std::getenv("ATEN_CPU_CAPABILITY"), "avx2");
  EXPECT_STREQ(std::getenv("ONEDNN_MAX_CPU_ISA"), "AVX2");
  EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), "Haswell");
  EXPECT_THROW(bench::applyIsa("avx512"), std::invalid_argument);
  for (const char* v : bench::kIsaVariables) unsetenv(v);
  for (const auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
}

}  // namespace
}  // namespace cohort
