#include "cohort/launch/supervisor.h"

#include <fmt/format.h>

#include <sys/prctl.h>
#include <sys/wait.h>

#include <cerrno>
#include <thread>

#include "cohort/core/log.h"
#include "cohort/launch/fork_server.h"
#include "cohort/launch/spawn.h"

namespace cohort::launch {
namespace {

// Processes this process adopted as a child subreaper (fork_server.h): a
// rank's own children that outlived it (the gdbserver of --debug-on-failure
// when the rank was killed, say). Nobody else waits for them: reaped here,
// so that none stays a zombie. A zombie that is one of `children` is left
// to the caller's reap.
void reapAdopted(const std::vector<Supervisor::Child>& children) {
  int subreaper = 0;
  if (prctl(PR_GET_CHILD_SUBREAPER, &subreaper) != 0 || subreaper == 0) return;
  for (;;) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    for (const auto& c : children) {
      if (c.running && c.pid == info.si_pid) return;
    }
    if (::waitpid(info.si_pid, nullptr, WNOHANG) != info.si_pid) return;
  }
}

}  // namespace

Supervisor::~Supervisor() {
  killAll();
  for (auto& c : children_) {
    if (c.running) ::waitpid(c.pid, nullptr, 0);
  }
  for (auto& c : children_) c.running = false;
  reapAdopted(children_);
}

void Supervisor::start(int rank, const std::string& exe, const std::vector<std::string>& args,
                       const std::vector<std::string>* env, const sigset_t* mask, const char* what) {
  Child c;
  c.rank = rank;
  // cohort-torch's ranks fork from a process with LibTorch loaded
  // (fork_server.h); any other program, or when that fails, by exec.
  ForkServer* server = ForkServer::forEngine(exe);
  c.pid = server != nullptr ? server->start(args, env, mask) : -1;
  if (c.pid < 0) c.pid = spawn(exe, args, env, mask, what);
  c.running = true;
  children_.push_back(c);
}

std::vector<int> Supervisor::reap(const std::function<void(const Child&)>& ended) {
  std::vector<int> lost;
  for (auto& c : children_) {
    if (!c.running) continue;
    int status = 0;
    const pid_t pid = ::waitpid(c.pid, &status, WNOHANG);
    if (pid == 0 || (pid < 0 && errno == EINTR)) continue;
    c.running = false;
    if (pid < 0) {
      lost.push_back(c.rank);
      continue;
    }
    c.status = status;
    ended(c);
  }
  reapAdopted(children_);
  return lost;
}

bool Supervisor::anyRunning() const {
  for (const auto& c : children_) {
    if (c.running) return true;
  }
  return false;
}

void Supervisor::signalAll(int sig) {
  for (const auto& c : children_) {
    if (c.running) ::kill(c.pid, sig);
  }
}

void Supervisor::killAll() {
  for (auto& c : children_) {
    if (!c.running) continue;
    ::kill(c.pid, SIGKILL);
    c.killedByUs = true;
  }
  if (abandonAt_ == kNever) abandonAt_ = Clock::now() + kAbandonAfter;
  killAt_ = kNever;
}

void Supervisor::stop(int sig, std::chrono::milliseconds grace, bool killAfter) {
  if (abandonAt_ != kNever) return;  // SIGKILL was sent: only giving up is left
  if (sig == SIGKILL) {
    killAll();
    return;
  }
  if (sig != 0) signalAll(sig);
  stopSignal_ = sig;
  grace_ = grace;
  killAfter_ = killAfter;
  killAt_ = Clock::now() + grace;
}

bool Supervisor::enforce() {
  const auto now = Clock::now();
  if (now >= killAt_) {
    if (!killAfter_) {
      killAt_ = kNever;
      return false;
    }
    for (const auto& c : children_) {
      if (!c.running) continue;
      log::warn("rank {} did not stop within {} ms{}: sending SIGKILL", c.rank, grace_.count(),
                stopSignal_ != 0 ? fmt::format(" of SIG{}", sigabbrev_np(stopSignal_)) : std::string());
    }
    killAll();
  }
  if (now >= abandonAt_) {
    for (const auto& c : abandon()) {
      log::error("rank {} (pid {}) did not end {} s after SIGKILL; giving up on it", c.rank, c.pid,
                 kAbandonAfter.count());
    }
    return false;
  }
  return true;
}

void Supervisor::watch(const Watch& w) {
  for (;;) {
    const auto lost = reap([&w](const Child& c) {
      if (w.ended) w.ended(c);
    });
    for (int rank : lost) {
      if (w.lost) w.lost(rank);
    }
    if (!anyRunning() || !enforce()) return;
    if (w.tick) w.tick();
    if (w.wait) {
      w.wait(w.poll);
    } else {
      std::this_thread::sleep_for(w.poll);
    }
  }
}

std::vector<Supervisor::Child> Supervisor::abandon() {
  std::vector<Child> left;
  for (auto& c : children_) {
    if (!c.running) continue;
    left.push_back(c);
    c.running = false;
  }
  return left;
}

}  // namespace cohort::launch
