#include "cohort/core/cpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace cohort {

const std::vector<std::string> kKernelFeatures = {
    "sse4_2",     "avx",         "avx2",        "fma",       "f16c",     "avx512f",
    "avx512bw",   "avx512vl",    "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
    "amx_bf16",   "amx_int8"};

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

CpuInfo cpuInfo() {
  CpuInfo out;
  out.model = "unknown";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  bool haveModel = false, haveFlags = false;
  std::set<std::string> flags;
  while (std::getline(in, line) && !(haveModel && haveFlags)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "model name" && !haveModel) {
      out.model = value;
      haveModel = true;
    } else if (key == "flags" && !haveFlags) {
      std::istringstream words(value);
      for (std::string w; words >> w;) flags.insert(w);
      haveFlags = true;
    }
  }
  for (const auto& f : kKernelFeatures) {
    if (flags.count(f) != 0) out.features.push_back(f);
  }
  return out;
}

std::string describe(const CpuInfo& cpu) {
  return fmt::format("{} ({})", cpu.model,
                     cpu.features.empty() ? "no vector extensions listed"
                                          : fmt::format("{}", fmt::join(cpu.features, " ")));
}

}  // namespace cohort
