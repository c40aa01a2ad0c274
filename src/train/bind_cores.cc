#include "cohort/train/bind_cores.h"

#include <fmt/format.h>
#include <sched.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "cohort/core/error.h"

namespace cohort::train {

std::vector<int> allowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cores;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  }
  return cores;
}

std::vector<int> coresOfRank(BindCores mode, const std::vector<int>& allowed, int localRank, int localRanks,
                             int threads) {
  if (mode == BindCores::off || threads < 1 || localRanks < 1) return {};
  const size_t need = static_cast<size_t>(localRanks) * static_cast<size_t>(threads);
  if (mode == BindCores::on && need > allowed.size()) {
    throw ConfigError(fmt::format(
        "compute.bind_cores: on: {} rank(s) on this machine x {} thread(s) need {} cores, this process "
        "may run on {} ({}); lower distribution.threads_per_rank or set compute.bind_cores: auto",
        localRanks, threads, need, allowed.size(), describeCores(allowed)));
  }
  if (mode == BindCores::automatic && need != allowed.size()) return {};
  const auto first = allowed.begin() + static_cast<std::ptrdiff_t>(localRank) * threads;
  return {first, first + threads};
}

void bindProcess(const std::vector<int>& cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cores) CPU_SET(c, &set);
  // The affinity is per thread: every thread running now, and threads
  // started later inherit it from the one that starts them.
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    if (sched_setaffinity(tid, sizeof set, &set) != 0 && errno != ESRCH) {
      throw Error(fmt::format("compute.bind_cores: sched_setaffinity(thread {}, cores {}): {}", tid,
                              describeCores(cores), std::strerror(errno)));
    }
  }
  if (ec) throw Error(fmt::format("compute.bind_cores: /proc/self/task: {}", ec.message()));
}

std::string describeCores(const std::vector<int>& cores) {
  std::string out;
  for (size_t i = 0; i < cores.size();) {
    size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? std::to_string(cores[i]) : fmt::format("{}-{}", cores[i], cores[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace cohort::train
