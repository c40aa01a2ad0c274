// --debug-on-failure: a rank that fails waits for a debugger
// (cohort/launch/debug.h).
//
// A fatal signal is taken by a handler that only calls async-signal-safe
// functions: everything it needs (gdbserver's arguments, the message) is
// built when it is installed. It writes how to attach and starts gdbserver
// attached to this process under a watcher that keeps the time
// (startWatchedServer), and waits until gdbserver ends (the debugger
// detached) or the time is up; then the signal takes its default action, as
// it would have at once. An exception is waited on where the rank's
// training ended, with the process's state (its process groups among it)
// still there, so that the other ranks stay in their collective.

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/launch/debug.h"
#include "launch/detail/debug_attach.h"

extern char** environ;

namespace cohort::launch {
namespace {

// Built by installDebugOnFailure, read by the handler.
struct FailureWait {
  int seconds = 0;
  int rank = 0;
  std::string gdbserver, head, tail;  // the message: head + signal name + tail
  detail::AttachPoint at;
  std::vector<std::string> args;
  std::vector<char*> argv;
};
FailureWait* failureWait = nullptr;
std::atomic<bool> failureTaken{false};
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

void say(const char* text) {
  size_t n = std::strlen(text);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

double monotonicSeconds() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// gdbserver stops this process as it attaches, and keeps it stopped until
// a debugger connects and lets it go: the time can only be kept outside it.
// A watcher, forked from this process, starts gdbserver (`path`, `argv`)
// and ends it when it has not ended `seconds` later, which detaches it and
// lets this process go on. Returns the watcher's pid, -1 when fork failed.
// Async-signal-safe.
pid_t startWatchedServer(const char* path, char* const* argv, int seconds) {
  const pid_t watcher = _Fork();
  if (watcher != 0) return watcher;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  const pid_t server = _Fork();
  if (server == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execve(path, argv, environ);
    say("cohort: cannot execute gdbserver\n");
    _exit(127);
  }
  const double until = monotonicSeconds() + seconds;
  while (server > 0 && monotonicSeconds() < until) {
    if (::waitpid(server, nullptr, WNOHANG) == server) _exit(0);
    const timespec tick{0, 100'000'000};
    ::nanosleep(&tick, nullptr);
  }
  if (server > 0) {
    ::kill(server, SIGKILL);
    while (::waitpid(server, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  _exit(0);
}

// Waits for the watcher: until the debugger detached, or the time is up.
// Async-signal-safe.
void waitForWatcher(pid_t watcher) {
  if (watcher <= 0) return;
  while (::waitpid(watcher, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void onFatalSignal(int sig) {
  FailureWait* w = failureWait;
  if (w == nullptr || failureTaken.exchange(true)) {
    // Another thread is waiting for the debugger already: this one waits
    // with it, until the process ends.
    for (;;) {
      const timespec tick{1, 0};
      ::nanosleep(&tick, nullptr);
    }
  }
  say(w->head.c_str());
  const char* name = sigabbrev_np(sig);
  say(name != nullptr ? name : "?");
  say(w->tail.c_str());
  waitForWatcher(startWatchedServer(w->gdbserver.c_str(), w->argv.data(), w->seconds));
  say("cohort: no longer waiting for a debugger; the rank ends as it would have\n");
  // The default action now: at once for a signal sent (raise, abort), on
  // returning for a fault (the instruction runs again).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  sigprocmask(SIG_UNBLOCK, &only, nullptr);
  ::raise(sig);
}

}  // namespace

void installDebugOnFailure(int rank, int world, const std::string& masterAddr) {
  const int seconds = env::debugOnFailureSeconds().value_or(0);
  if (seconds <= 0 || failureWait != nullptr) return;
  auto* w = new FailureWait;  // for the life of the process: the handler reads it
  w->seconds = seconds;
  w->rank = rank;
  w->gdbserver = gdbserverPath();
  w->at = detail::attachPoint(masterAddr);
  const detail::AttachPoint& at = w->at;
  detail::allowTracing();
  w->args = {w->gdbserver, "--once", "--attach", at.listen, std::to_string(::getpid())};
  for (auto& a : w->args) w->argv.push_back(a.data());
  w->argv.push_back(nullptr);
  w->head = fmt::format("cohort: rank {}/{} failed (SIG", rank, world);
  w->tail = fmt::format(
      "); it waits {} s for a debugger (--debug-on-failure): gdbserver on {}, program {}\n"
      "cohort: rank {}: attach with: {}\n"
      "cohort: rank {}: the other ranks are held; detach in the debugger to end the wait\n",
      seconds, at.shown, at.program, rank, gdbCommand(at.shown, at.program), rank);
  failureWait = w;
  // A stack overflow's SIGSEGV needs a stack of its own (this thread's).
  static std::vector<char> altStack(1 << 16);
  stack_t ss{};
  ss.ss_sp = altStack.data();
  ss.ss_size = altStack.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = onFatalSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_ONSTACK;
  for (int sig : kFatalSignals) sigaction(sig, &sa, nullptr);
  log::info("--debug-on-failure: if this rank fails it waits {} s for a debugger on {}", seconds, at.shown);
}

void skipDebuggerOnFailure(const std::string& what) {
  if (env::debugOnFailureSeconds().value_or(0) <= 0 || failureTaken.exchange(true)) return;
  log::warn("--debug-on-failure: this rank failed because a peer did ({}); it does not wait for a debugger",
            what);
}

void waitForDebuggerOnFailure(const std::string& what) {
  const int seconds = env::debugOnFailureSeconds().value_or(0);
  if (seconds <= 0 || failureTaken.exchange(true)) return;
  try {
    const std::string gdbserver = gdbserverPath();
    // The port chosen at installation when there was one (a node's address
    // on a job of several machines), else one on loopback.
    const FailureWait* installed = failureWait;
    const int rank = installed != nullptr ? installed->rank : 0;
    const detail::AttachPoint at = installed != nullptr ? installed->at : detail::attachPoint("");
    detail::allowTracing();
    log::error("rank {} failed ({}); it waits {} s for a debugger (--debug-on-failure): gdbserver on {}, "
               "program {}",
               rank, what, seconds, at.shown, at.program);
    log::error("rank {}: attach with: {}", rank, gdbCommand(at.shown, at.program));
    log::error("rank {}: the other ranks are held; detach in the debugger to end the wait", rank);
    log::flush();
    std::vector<std::string> args = {gdbserver, "--once", "--attach", at.listen, std::to_string(::getpid())};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    waitForWatcher(startWatchedServer(gdbserver.c_str(), argv.data(), seconds));
    log::error("rank {}: no longer waiting for a debugger; the rank ends as it would have", rank);
  } catch (const std::exception& e) {
    log::error("--debug-on-failure: cannot wait for a debugger: {}", e.what());
  }
}

}  // namespace cohort::launch
