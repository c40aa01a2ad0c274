#pragma once

// Signals taken synchronously: the calling thread blocks a set of signals for
// the object's lifetime and waits for them with a timeout (sigtimedwait), so
// a signal is handled between two steps of a loop instead of interrupting it.
// Threads started meanwhile inherit the blocked mask.

#include <signal.h>

#include <chrono>
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

}  // namespace cohort
