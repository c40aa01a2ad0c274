#pragma once

// Signals taken synchronously: the calling thread blocks a set of signals for
// the object's lifetime and waits for them with a timeout (sigtimedwait), so
// a signal is handled between two steps of a loop instead of interrupting it.
// Threads started meanwhile inherit the blocked mask.
//
// Stop signals held from the first instruction: a rank, an agent or a
// launcher that is told to stop while it starts (Slurm's time-limit warning
// may come a second after a requeued job starts; a preemption any time)
// must not die of the signal's default action before it can act on it. The
// programs block them first thing in main (holdStopSignals); the mask
// survives fork and exec, so the signal waits, pending, until the process
// takes it.

#include <signal.h>

#include <chrono>
#include <cstring>
#include <initializer_list>

namespace cohort {

class BlockedSignals {
 public:
  explicit BlockedSignals(std::initializer_list<int> signals) {
    sigemptyset(&set_);
    for (int s : signals) sigaddset(&set_, s);
    pthread_sigmask(SIG_BLOCK, &set_, &original_);
  }
  // Restores the mask from before.
  ~BlockedSignals() { pthread_sigmask(SIG_SETMASK, &original_, nullptr); }
  BlockedSignals(const BlockedSignals&) = delete;
  BlockedSignals& operator=(const BlockedSignals&) = delete;

  // The signal that arrived within `timeout`, or 0.
  int wait(std::chrono::milliseconds timeout) {
    timespec ts{static_cast<time_t>(timeout.count() / 1000),
                static_cast<long>((timeout.count() % 1000) * 1000000)};
    const int sig = sigtimedwait(&set_, nullptr, &ts);
    return sig > 0 ? sig : 0;
  }
  // The mask before: what child processes should get back.
  const sigset_t& original() const { return original_; }

 private:
  sigset_t set_;
  sigset_t original_;
};

// The signals a rank acts on (train/worker.cc): SIGINT, SIGTERM (stop after
// a checkpoint), SIGUSR2 (Slurm's warning; a re-form under an agent),
// SIGUSR1 (an abandoned round under an agent).
inline sigset_t rankStopSignals() {
  sigset_t s;
  sigemptyset(&s);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2}) sigaddset(&s, sig);
  return s;
}

// `base` with the rank's stop signals blocked: the mask ranks start with, so
// that a stop sent while they load waits for their signal thread.
inline sigset_t withRankStopSignals(sigset_t base) {
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2}) sigaddset(&base, sig);
  return base;
}

// Blocks, in the calling thread, the signals command `command` (argv[1])
// takes later: a rank's (worker), an agent's (SIGINT, SIGTERM, SIGUSR2) or
// a launcher's (run: SIGINT, SIGTERM). Other commands keep the defaults.
// Called first thing in main, before any thread exists.
inline void holdStopSignals(const char* command) {
  if (command == nullptr) return;
  sigset_t s;
  sigemptyset(&s);
  if (std::strcmp(command, "worker") == 0) {
    s = rankStopSignals();
  } else if (std::strcmp(command, "agent") == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGUSR2}) sigaddset(&s, sig);
  } else if (std::strcmp(command, "run") == 0) {
    for (int sig : {SIGINT, SIGTERM}) sigaddset(&s, sig);
  } else {
    return;
  }
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

}  // namespace cohort
