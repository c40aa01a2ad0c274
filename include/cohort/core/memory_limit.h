#pragma once

// How much memory this process may use, and whether the kernel's OOM killer
// has been at work: what the ZeRO fit check (train/detail/memory_fit.h) and
// the launcher's report of a killed rank read. The limit is the smaller of
// the machine's memory (/proc/meminfo MemTotal) and this process's memory
// cgroup's limit (cgroup v2 memory.max, v1 memory.limit_in_bytes), found
// through /proc/self/cgroup. `root` prefixes every path (tests use a fake
// tree; "" is the real one).

#include <cstdint>
#include <optional>
#include <string>

namespace cohort::memory {

struct Limit {
  uint64_t bytes = 0;  // 0: unknown (nothing readable)
  std::string source;  // "MemTotal" or the cgroup file it was read from
};

Limit processLimit(const std::string& root = "");

// This process's resident memory now (/proc/self/status VmRSS); 0 when
// unreadable.
uint64_t residentBytes(const std::string& root = "");

// The most memory this process has held resident at once, in MiB
// (getrusage's ru_maxrss); 0 when unknown.
double peakResidentMb();

// Processes the OOM killer has killed in this process's memory cgroup
// (v2 memory.events "oom_kill", v1 memory.oom_control "oom_kill"); nullopt
// when the cgroup does not say.
std::optional<uint64_t> oomKills(const std::string& root = "");

}  // namespace cohort::memory
