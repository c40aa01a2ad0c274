#include "util/cgroup.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace cohort::test {

MemoryCgroup::MemoryCgroup(const std::string& name) {
  if (::geteuid() != 0) {
    why_ = "needs root, to make a memory cgroup";
    return;
  }
  const std::string leaf = fmt::format("cohort-test-{}-{}", name, ::getpid());
  if (fs::exists("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
    path_ = "/sys/fs/cgroup/memory/" + leaf;
    limitName_ = "memory.limit_in_bytes";
  } else if (fs::exists("/sys/fs/cgroup/cgroup.controllers")) {
    path_ = "/sys/fs/cgroup/" + leaf;
    limitName_ = "memory.max";
  } else {
    why_ = "no memory cgroup under /sys/fs/cgroup";
    return;
  }
  std::error_code ec;
  if (!fs::create_directory(path_, ec) || !fs::exists(limitFile())) {
    fs::remove(path_, ec);
    why_ = "cannot make a memory cgroup here: " + (ec ? ec.message() : "no " + limitName_);
    path_.clear();
  }
}

MemoryCgroup::~MemoryCgroup() {
  std::error_code ec;
  if (!path_.empty()) fs::remove(path_, ec);  // empty: every process in it has ended
}

void MemoryCgroup::setLimit(int64_t bytes) const { std::ofstream(limitFile()) << bytes; }

std::vector<std::string> MemoryCgroup::wrap(const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {"/bin/sh", "-c", "echo $$ > \"$1/cgroup.procs\" && shift && exec \"$@\"",
                                  "sh", path_};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace cohort::test
