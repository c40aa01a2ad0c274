#pragma once

// Rank processes started and watched together: the ranks of one attempt of
// `cohort run`, of one round of `cohort agent`, of `cohort health` and of
// `cohort score`. The supervisor starts them (spawn.h), reaps those that
// end without blocking, and stops the rest with one policy (stop()):
// a signal, SIGKILL after a grace period, and giving up on a rank SIGKILL
// did not end. When destroyed it SIGKILLs and reaps whatever still runs, so
// an exception on the way leaves no process behind.

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace cohort::launch {

class Supervisor {
 public:
  struct Child {
    int rank = 0;
    pid_t pid = -1;
    bool running = false;
    bool killedByUs = false;  // ended by killAll()
    int status = 0;           // the wait status, once it ended
  };

  Supervisor() = default;
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts rank `rank`: spawn(exe, args, env, mask, what). Throws Error when
  // fork fails (the ranks started so far are killed by the destructor).
  void start(int rank, const std::string& exe, const std::vector<std::string>& args,
             const std::vector<std::string>* env, const sigset_t* mask, const char* what);

  // Reaps every child that ended, without blocking, and calls `ended` for
  // each, in the order found. Returns the ranks of children that can no
  // longer be waited for (no longer this process's children): they stop
  // counting as running.
  std::vector<int> reap(const std::function<void(const Child&)>& ended);

  bool anyRunning() const;
  // Sends `sig` to every running child.
  void signalAll(int sig);
  // SIGKILLs every running child and marks it killedByUs.
  void killAll();
  // Stops waiting for the children still running (after SIGKILL, a process
  // stuck in the kernel may never be reaped) and returns them.
  std::vector<Child> abandon();

  const std::vector<Child>& children() const { return children_; }

  // How long a rank SIGKILL did not end is waited for: a process stuck in
  // the kernel may never be reaped.
  static constexpr std::chrono::seconds kAbandonAfter{10};

  // Stops the group: sends `sig` to every running rank now (0: none, they
  // stop on their own), and `grace` later SIGKILLs what still runs (with
  // `killAfter`; without, watch() just returns then). SIGKILL as `sig`
  // kills at once. A rank SIGKILL has not ended kAbandonAfter later is
  // reported and no longer waited for. A later call replaces the deadline,
  // unless SIGKILL was sent already.
  void stop(int sig, std::chrono::milliseconds grace, bool killAfter = true);

  // What watch() calls; every hook may call stop().
  struct Watch {
    std::function<void(const Child&)> ended;  // each rank that ended, as reaped
    std::function<void(int rank)> lost;       // a rank that can no longer be waited for
    std::function<void()> tick;               // once a poll: stall checks, deadlines
    // Waits at most the poll interval: the owner's signal wait, say.
    // Default: sleep.
    std::function<void(std::chrono::milliseconds)> wait;
    std::chrono::milliseconds poll{20};
  };
  // Watches until no rank is left to wait for (or a stop without
  // killAfter runs out of grace): reap, apply stop()'s deadlines, tick, wait.
  void watch(const Watch& w);

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::time_point kNever = Clock::time_point::max();
  // SIGKILL or give up when their time comes; false once nothing is left to
  // wait for.
  bool enforce();

  std::vector<Child> children_;
  Clock::time_point killAt_ = kNever;     // stop(): SIGKILL at this time
  Clock::time_point abandonAt_ = kNever;  // SIGKILL sent: stop waiting at this time
  bool killAfter_ = true;
  int stopSignal_ = 0;
  std::chrono::milliseconds grace_{0};
};

}  // namespace cohort::launch
