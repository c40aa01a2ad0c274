#include "cohort/core/memory_limit.h"

#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace cohort::memory {

namespace {

// The memory cgroup hierarchy's mount and this process's directory in it:
// v2 ("0::/path") when there is no v1 memory controller line
// ("N:...memory...:/path"). A directory that is not there (a container
// whose mount is its own cgroup) is the mount itself.
struct Cgroup {
  std::string base, dir;
};

std::optional<Cgroup> cgroupOf(const std::string& root) {
  std::ifstream in(root + "/proc/self/cgroup");
  std::string line;
  std::optional<Cgroup> v2;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::optional<Cgroup> found;
    if (controllers.empty() && line.compare(0, a, "0") == 0) {
      v2 = Cgroup{root + "/sys/fs/cgroup", root + "/sys/fs/cgroup" + path};
    }
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');) {
      if (c == "memory") found = Cgroup{root + "/sys/fs/cgroup/memory", root + "/sys/fs/cgroup/memory" + path};
    }
    if (found) {
      v2 = found;
      break;
    }
  }
  if (v2) {
    std::error_code ec;
    if (!std::filesystem::is_directory(v2->dir, ec)) v2->dir = v2->base;
  }
  return v2;
}

std::optional<uint64_t> readNumber(const std::string& file) {
  std::ifstream in(file);
  std::string word;
  if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos ||
      word.size() > 19) {
    return std::nullopt;  // missing, "max" (v2: no limit), or not a number
  }
  return std::stoull(word);
}

// The value after `key` in a file of "key value" lines.
std::optional<uint64_t> readKey(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string k;
    uint64_t v = 0;
    if (words >> k >> v && k == key) return v;
  }
  return std::nullopt;
}

}  // namespace

double peakResidentMb() {
  struct rusage usage {};
  return ::getrusage(RUSAGE_SELF, &usage) == 0 ? double(usage.ru_maxrss) / 1024.0 : 0.0;
}

uint64_t residentBytes(const std::string& root) {
  return readKey(root + "/proc/self/status", "VmRSS:").value_or(0) * 1024;
}

Limit processLimit(const std::string& root) {
  Limit out;
  if (auto kb = readKey(root + "/proc/meminfo", "MemTotal:")) {
    out.bytes = *kb * 1024;
    out.source = "MemTotal";
  }
  if (auto cg = cgroupOf(root)) {
    // The smallest limit of this cgroup and its ancestors (a limit set on a
    // parent slice applies too).
    for (std::filesystem::path dir = cg->dir;; dir = dir.parent_path()) {
      for (const char* name : {"memory.max", "memory.limit_in_bytes"}) {
        const std::string file = (dir / name).string();
        auto limit = readNumber(file);
        // v1 writes "no limit" as a number near 2^63.
        if (limit && (out.bytes == 0 || *limit < out.bytes)) {
          out.bytes = *limit;
          out.source = file;
        }
      }
      if (dir.string().size() <= cg->base.size() || !dir.has_parent_path()) break;
    }
  }
  return out;
}

std::optional<uint64_t> oomKills(const std::string& root) {
  auto cg = cgroupOf(root);
  if (!cg) return std::nullopt;
  if (auto n = readKey(cg->dir + "/memory.events", "oom_kill")) return n;
  return readKey(cg->dir + "/memory.oom_control", "oom_kill");
}

}  // namespace cohort::memory
