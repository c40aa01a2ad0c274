#pragma once

// The machine's GEMM ceiling: the best a rank's threads reach in an n x n
// matrix product (n = 1024) in float32 or bfloat16, through LibTorch's
// torch::mm or, in float32, through oneDNN's sgemm, which cohort's linear
// layers run (models/linear.h). Model
// FLOPs utilization (MFU, models/flops.h) is achieved model FLOP/s against
// it. It is measured once per machine and kept in
// <machineCacheDir()>/gemm-ceiling.json (core/env.h: COHORT_CACHE_DIR,
// $XDG_CACHE_HOME/cohort or ~/.cache/cohort), one entry per CPU, dtype,
// thread count, LibTorch version and instruction-set hold (an MFU under
// ONEDNN_MAX_CPU_ISA=AVX2 is against what AVX2 reaches); a later measurement of the same entry
// replaces it only when higher (a ceiling first measured on a busy machine
// rises the next time `cohort health` runs on a quiet one).
//
// This header does not include LibTorch.

#include <optional>
#include <string>

namespace cohort::health {

struct GemmCeiling {
  double gflops = 0;       // best GFLOP/s of one product
  std::string library;     // the product that reached it: torch::mm | oneDNN sgemm
  std::string dtype;       // float32 | bfloat16
  int threads = 1;         // the rank's intra-op threads
  int n = 1024;            // n x n x n
  std::string cpu;         // describe(cpuInfo())
  std::string libtorch;    // LibTorch's version
  std::string holds;       // env::instructionSetHolds() when measured; "" none
  std::string measuredAt;  // UTC, ISO 8601
  std::string file;        // the cache file it was read from or written to
  bool cached = false;     // read from the file (else measured now)
  bool busy = false;       // measured now on a busy machine (Measure::once): not kept
};

// <machineCacheDir()>/gemm-ceiling.json
std::string ceilingCacheFile();

// What gemmCeiling does when the cache has no entry: nothing, measure and
// keep, or measure for the caller only (a busy machine's figure would stay
// low, and every later run's utilization high).
enum class Measure { no, keep, once };

// The ceiling for `dtype` with `threads` threads: from the cache file, or,
// when it has no entry, measured now as `measure` says (about `seconds`,
// with the calling process's intra-op threads, which must be `threads`).
// nullopt when not cached and not measured,
// or when the measurement failed. A cache file cohort cannot read is
// replaced; one it cannot write leaves the measurement unsaved (logged),
// never an error.
std::optional<GemmCeiling> gemmCeiling(const std::string& dtype, int threads, Measure measure,
                                       double seconds = 0.5);

// Measures now and records the result when it is higher than the cached
// entry (`cohort health`). Returns what is kept: the higher of the two.
GemmCeiling remeasureGemmCeiling(const std::string& dtype, int threads, double seconds = 1.0);

// "80.1 GFLOP/s float32 x 1 thread (n 1024, measured 2026-12-06T19:20:00Z)"
std::string describe(const GemmCeiling& c);

}  // namespace cohort::health
