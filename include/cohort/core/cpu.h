#pragma once

// The machine's CPU as /proc/cpuinfo describes it, for logs, summaries and
// benchmarks: which processor a figure was measured on, and which of the
// instruction sets LibTorch, oneDNN and OpenBLAS choose kernels by it has.

#include <string>
#include <vector>

namespace cohort {

struct CpuInfo {
  std::string model;                  // "model name", or "unknown"
  std::vector<std::string> features;  // of kKernelFeatures, those the CPU has, in that order
};

// The instruction-set flags that decide kernels (avx2, fma, avx512f,
// avx512_bf16, amx_bf16, ...), in the order they are reported.
extern const std::vector<std::string> kKernelFeatures;

// Reads /proc/cpuinfo (the first processor). Never throws: a machine without
// it reports model "unknown" and no features.
CpuInfo cpuInfo();

// "AMD EPYC 9xx (avx2 fma avx512f ...)".
std::string describe(const CpuInfo& cpu);

}  // namespace cohort
