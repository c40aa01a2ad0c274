#include "comm/detail/segment.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "cohort/core/error.h"

namespace cohort::comm::detail {

void* mapSegment(const std::string& name, size_t bytes, bool create) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | (create ? O_CREAT | O_EXCL : 0), 0600);
  if (fd < 0) {
    throw IoError(fmt::format("shared memory {}: cannot {}: {}", name, create ? "create" : "open",
                              std::strerror(errno)));
  }
  // Reserve the pages now: tmpfs grants any size to ftruncate and raises
  // SIGBUS at the first touch past its limit (Docker's /dev/shm is 64 MB).
  const int sized = create ? ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) : 0;
  if (sized != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw IoError(fmt::format("shared memory {}: cannot reserve {} MB: {} (is /dev/shm big enough?)",
                              name, bytes >> 20, std::strerror(sized)));
  }
  struct stat st {};
  if (!create && (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes)) {
    ::close(fd);
    throw IoError(fmt::format("shared memory {}: {} bytes, {} expected", name, st.st_size, bytes));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    if (create) ::shm_unlink(name.c_str());
    throw IoError(fmt::format("shared memory {}: cannot map {} MB: {}", name, bytes >> 20, std::strerror(e)));
  }
  return base;
}

void unmapSegment(void* base, size_t bytes) { ::munmap(base, bytes); }

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word is shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, timeout, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool processAlive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;  // no /proc: trust kill()
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  // "pid (comm) S ...": the state follows the last ')'.
  const char* close = std::strrchr(buf, ')');
  return !(n > 0 && close != nullptr && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X'));
}

}  // namespace cohort::comm::detail
