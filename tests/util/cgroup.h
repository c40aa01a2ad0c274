#pragma once

// A memory cgroup of a test's own (root only): processes started through
// wrap() run inside it under setLimit()'s limit, so a test can give each
// rank the memory of a small machine. cgroup v1 (memory.limit_in_bytes) or
// v2 (memory.max); removed on destruction, once its processes have ended.

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::test {

class MemoryCgroup {
 public:
  // `name` is made unique with this process's pid.
  explicit MemoryCgroup(const std::string& name);
  ~MemoryCgroup();
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  // Why no cgroup could be made (not root, no memory controller); empty
  // when it was.
  const std::string& unavailable() const { return why_; }
  const std::string& path() const { return path_; }
  // The file its limit is read from (what cohort's fit check names).
  std::string limitFile() const { return path_ + "/" + limitName_; }
  void setLimit(int64_t bytes) const;
  // argv run inside the cgroup: a shell joins it, then execs argv.
  std::vector<std::string> wrap(const std::vector<std::string>& argv) const;

 private:
  std::string path_, limitName_, why_;
};

}  // namespace cohort::test
