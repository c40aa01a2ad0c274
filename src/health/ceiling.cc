#include "cohort/health/ceiling.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cohort/core/cpu.h"
#include "cohort/core/env.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/time.h"
#include "cohort/core/version.h"
#include "cohort/health/health.h"

namespace cohort::health {
namespace {

constexpr int kN = 1024;
// What an entry measured: since cohort 2026-12-07 float32 entries are the
// better of torch::mm and oneDNN's sgemm. Entries without it measured
// torch::mm alone, which BLAS's own choice of kernels can hold far below
// the CPU (OPENBLAS_CORETYPE), and are measured again.
constexpr const char* kProducts = "torch::mm, oneDNN sgemm";

// The entry for c's machine, dtype and threads, of any cohort.
bool sameKey(const nlohmann::json& e, const GemmCeiling& c) {
  return e.is_object() && e.value("cpu", "") == c.cpu && e.value("dtype", "") == c.dtype &&
         e.value("threads", 0) == c.threads && e.value("n", 0) == c.n && e.value("libtorch", "") == c.libtorch &&
         e.value("holds", "") == c.holds;
}

// ... measured as this cohort measures it.
bool sameEntry(const nlohmann::json& e, const GemmCeiling& c) {
  return sameKey(e, c) && e.value("products", "") == kProducts;
}

// The file's entries; an array even when the file is missing or not
// cohort's (then it is rewritten whole at the next measurement).
nlohmann::json readEntries(const std::string& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::array();
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("entries") || !j["entries"].is_array()) {
    log::warn("{}: not a GEMM ceiling cache cohort can read; it is measured again and replaced", file);
    return nlohmann::json::array();
  }
  return j["entries"];
}

GemmCeiling keyOf(const std::string& dtype, int threads) {
  GemmCeiling c;
  c.dtype = dtype;
  c.threads = threads;
  c.n = kN;
  c.cpu = describe(cpuInfo());
  c.libtorch = torchVersion();
  c.holds = env::instructionSetHolds();
  c.file = ceilingCacheFile();
  return c;
}

std::optional<GemmCeiling> lookUp(const GemmCeiling& key) {
  for (const auto& e : readEntries(key.file)) {
    if (!sameEntry(e, key)) continue;
    const double g = e.value("gflops", 0.0);
    if (!(g > 0)) continue;
    GemmCeiling c = key;
    c.gflops = g;
    c.measuredAt = e.value("measured_at", "");
    c.library = e.value("library", "");
    c.cached = true;
    return c;
  }
  return std::nullopt;
}

// Writes `c` into the file, replacing its entry. Two processes writing at
// once each rename a whole file: one entry may be lost, never the file.
void store(const GemmCeiling& c) {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& e : readEntries(c.file)) {
    if (!sameKey(e, c)) entries.push_back(e);
  }
  entries.push_back({{"cpu", c.cpu},
                     {"dtype", c.dtype},
                     {"threads", c.threads},
                     {"n", c.n},
                     {"libtorch", c.libtorch},
                     {"holds", c.holds},
                     {"products", kProducts},
                     {"library", c.library},
                     {"gflops", c.gflops},
                     {"measured_at", c.measuredAt}});
  try {
    std::filesystem::create_directories(std::filesystem::path(c.file).parent_path());
    writeFileAtomic(c.file, nlohmann::json{{"version", 1}, {"entries", entries}}.dump(2) + "\n");
  } catch (const std::exception& e) {
    log::warn("the GEMM ceiling was measured but not kept: {}", e.what());
  }
}

GemmCeiling measure(const GemmCeiling& key, double seconds) {
  GemmCeiling c = key;
  c.gflops = measureMatmulGflops(c.n, seconds, c.dtype == "bfloat16", &c.library);
  c.measuredAt = utcNow();
  return c;
}

}  // namespace

std::string ceilingCacheFile() { return env::machineCacheDir() + "/gemm-ceiling.json"; }

std::optional<GemmCeiling> gemmCeiling(const std::string& dtype, int threads, Measure measureIfMissing,
                                       double seconds) {
  const GemmCeiling key = keyOf(dtype, threads);
  if (auto c = lookUp(key)) return c;
  if (measureIfMissing == Measure::no) return std::nullopt;
  try {
    GemmCeiling c = measure(key, seconds);
    if (measureIfMissing == Measure::once) {
      c.busy = true;
      return c;
    }
    store(c);
    return c;
  } catch (const std::exception& e) {
    log::warn("the GEMM ceiling ({}, {} threads) could not be measured: {}", dtype, threads, e.what());
    return std::nullopt;
  }
}

GemmCeiling remeasureGemmCeiling(const std::string& dtype, int threads, double seconds) {
  const GemmCeiling key = keyOf(dtype, threads);
  GemmCeiling now = measure(key, seconds);
  if (auto old = lookUp(key); old && old->gflops >= now.gflops) return *old;
  store(now);
  return now;
}

std::string describe(const GemmCeiling& c) {
  return fmt::format("{:.1f} GFLOP/s {} x {} thread{} (n {}, {}, measured {}{})", c.gflops, c.dtype, c.threads,
                     c.threads == 1 ? "" : "s", c.n, c.library.empty() ? "torch::mm" : c.library,
                     c.measuredAt.empty() ? "now" : c.measuredAt, c.holds.empty() ? "" : ", held: " + c.holds);
}

}  // namespace cohort::health
