#include "cohort/core/file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "cohort/core/error.h"

namespace fs = std::filesystem;

namespace cohort {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw IoError(fmt::format("{} {}: {}", what, path, std::strerror(err)));
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const fs::path target(path_);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create directory {}: {}", dir.string(), ec.message()));
  dir_ = dir.string();
  // Unique in this process too: two writers of one path never share a file.
  static std::atomic<uint64_t> next{0};
  tmp_ = (dir / fmt::format(".tmp.{}.{}.{}", target.filename().string(), getpid(), next++)).string();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0 && errno == EEXIST) {
    // Left by a process that ended before its commit and had this pid (a
    // restarted container reuses them): no writer of ours has it open.
    ::unlink(tmp_.c_str());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }
  if (fd_ < 0) fail("cannot create", tmp_, errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  if (fd_ < 0) throw IoError(fmt::format("cannot write {}: already closed", path_));
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path_, errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw IoError(fmt::format("cannot write {}: already closed", path_));
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp_.c_str());
    fail("cannot sync", path_, err);
  }
  if (::close(fd) != 0) {  // a write error the file system reports late
    const int err = errno;
    ::unlink(tmp_.c_str());
    fail("cannot write", path_, err);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    fail("cannot rename into", path_, err);
  }
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void writeFileAtomic(const std::string& path, const void* data, size_t size) {
  AtomicFile file(path);
  file.write(data, size);
  file.commit();
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) throw IoError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  return text.str();
}

std::string tailOfFile(const std::string& path, int lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::vector<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.erase(last.begin());
  }
  std::string s;
  for (const auto& l : last) s += "  " + l + "\n";
  return s;
}

}  // namespace cohort
