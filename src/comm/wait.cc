#include "cohort/comm/wait.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace cohort::comm {
namespace {

std::atomic<WaitObserver*> installed{nullptr};
std::atomic<bool> abandoned{false};
thread_local int depth = 0;

}  // namespace

void setWaitObserver(WaitObserver* observer) { installed.store(observer, std::memory_order_release); }

CollectiveWait::CollectiveWait(const char* what) {
  if (depth++ != 0) return;
  observer_ = installed.load(std::memory_order_acquire);
  if (observer_) observer_->waitBegins(what);
}

CollectiveWait::~CollectiveWait() {
  --depth;
  if (observer_) observer_->waitEnds();
}

void abandonCollectives() {
  abandoned.store(true, std::memory_order_release);
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == ::dirfd(d)) continue;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int type = 0;
    socklen_t len = sizeof(type);
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) continue;
    ::shutdown(fd, SHUT_RDWR);
  }
  ::closedir(d);
}

bool collectivesAbandoned() { return abandoned.load(std::memory_order_acquire); }

}  // namespace cohort::comm
