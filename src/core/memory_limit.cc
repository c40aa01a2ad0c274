#include "cohort/core/memory_limit.h"

#include <fstream>
#include <sstream>
#include <vector>

namespace cohort::memory {

namespace {

// The memory cgroup's directory: v2 ("0::/path") when there is no v1
// memory controller line ("N:...memory...:/path").
std::optional<std::string> cgroupDir(const std::string& root) {
  std::ifstream in(root + "/proc/self/cgroup");
  std::string line, v2;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty() && line.compare(0, a, "0") == 0) v2 = root + "/sys/fs/cgroup" + path;
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');) {
      if (c == "memory") return root + "/sys/fs/cgroup/memory" + path;
    }
  }
  if (!v2.empty()) return v2;
  return std::nullopt;
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

Limit processLimit(const std::string& root) {
  Limit out;
  if (auto kb = readKey(root + "/proc/meminfo", "MemTotal:")) {
    out.bytes = *kb * 1024;
    out.source = "MemTotal";
  }
  if (auto dir = cgroupDir(root)) {
    for (const char* name : {"/memory.max", "/memory.limit_in_bytes"}) {
      auto limit = readNumber(*dir + name);
      // v1 writes "no limit" as a number near 2^63.
      if (limit && (out.bytes == 0 || *limit < out.bytes)) {
        out.bytes = *limit;
        out.source = *dir + name;
      }
    }
  }
  return out;
}

std::optional<uint64_t> oomKills(const std::string& root) {
  auto dir = cgroupDir(root);
  if (!dir) return std::nullopt;
  if (auto n = readKey(*dir + "/memory.events", "oom_kill")) return n;
  return readKey(*dir + "/memory.oom_control", "oom_kill");
}

}  // namespace cohort::memory
