#pragma once

// The environment both sides of a comparison start with: bench/launch_env.py
// gives it for an allocator and a thread count (the preload PyTorch's CPU
// launcher would set, OMP_NUM_THREADS, and what the peer must find), and
// the two sides' reports are held to it (tests/bench/launch_env_test.cc
// checks that they report what they were started with).

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "test_paths.h"
#include "util/process.h"

namespace cohort::bench {

// launch_env.py's variables for `allocator` (glibc, tcmalloc or jemalloc)
// and `threads`; none for an empty `allocator` (each side starts as it
// would by default: the untuned comparison). Throws std::runtime_error
// with launch_env.py's message when it refuses.
inline std::map<std::string, std::string> launchEnvironment(const std::string& allocator, int threads) {
  if (allocator.empty()) return {};
  const auto r = test::run({COHORT_PYTHON, std::string(COHORT_SOURCE_DIR) + "/bench/launch_env.py", "env",
                            allocator, std::to_string(threads)});
  if (r.exitCode != 0) throw std::runtime_error("bench/launch_env.py failed:\n" + r.describe());
  std::map<std::string, std::string> env;
  const nlohmann::json vars = nlohmann::json::parse(r.out);
  for (auto it = vars.begin(); it != vars.end(); ++it) env[it.key()] = it.value().get<std::string>();
  return env;
}

// Throws std::runtime_error naming the difference unless cohort's side
// (summary.json's "compute") and the peer's ("launch") ran with the same
// allocator and intra- and inter-op threads, and, when the peer was started
// to bind its cores as cohort does (it then reports "bind_cores"), the same
// binding: a figure of unlike sides is not printed.
inline void requireSameLaunch(const nlohmann::json& cohortCompute, const nlohmann::json& peerLaunch,
                              const std::string& what) {
  for (const char* key : {"malloc", "intra_op_threads", "inter_op_threads", "bind_cores"}) {
    if (std::string(key) == "bind_cores" && !peerLaunch.contains(key)) continue;  // an untuned peer
    const nlohmann::json a = cohortCompute.value(key, nlohmann::json()), b = peerLaunch.value(key, nlohmann::json());
    if (a != b) {
      throw std::runtime_error(what + ": the sides ran differently: " + key + " " + a.dump() + " (cohort) against " +
                               b.dump() + " (peer)");
    }
  }
}

// The variables that hold a library's instruction sets below the CPU's:
// LibTorch's kernels, oneDNN's (two names) and OpenBLAS's.
inline constexpr const char* kIsaVariables[] = {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                                                "OPENBLAS_CORETYPE"};

// Sets, in this process's environment (both sides inherit it), the
// instruction sets the libraries run: "native", each library's own choice
// (the variables above removed: an OPENBLAS_CORETYPE=Haswell left in a
// machine's environment holds OpenBLAS to AVX2 on a CPU with AVX-512, and
// the peer's products with it); "avx2", every library held to AVX2; "env",
// as the environment has them. Returns the line the benchmark prints.
// Throws std::invalid_argument on another value.
inline std::string applyIsa(const std::string& isa) {
  std::string before;
  for (const char* v : kIsaVariables) {
    if (const char* value = std::getenv(v)) before += std::string(before.empty() ? "" : " ") + v + "=" + value;
  }
  if (isa == "native") {
    for (const char* v : kIsaVariables) unsetenv(v);
    return "instruction sets: each library's own choice" +
           (before.empty() ? std::string() : " (removed from the environment: " + before + ")");
  }
  if (isa == "avx2") {
    setenv("ATEN_CPU_CAPABILITY", "avx2", 1);
    setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
    setenv("DNNL_MAX_CPU_ISA", "AVX2", 1);
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    return "instruction sets held to AVX2 (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell)";
  }
  if (isa == "env") {
    return "instruction sets: as the environment says (" + (before.empty() ? std::string("nothing held") : before) +
           ")";
  }
  throw std::invalid_argument("--isa must be native, avx2 or env, got '" + isa + "'");
}

}  // namespace cohort::bench
