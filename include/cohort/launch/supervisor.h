#pragma once

// Rank processes started and watched together: the ranks of one attempt of
// `cohort run`, and the ranks of `cohort health`. The supervisor starts them
// (spawn.h), reaps those that end without blocking, signals or kills the
// rest, and, when destroyed, SIGKILLs and reaps whatever still runs, so an
// exception on the way leaves no process behind.

#include <signal.h>
#include <sys/types.h>

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

 private:
  std::vector<Child> children_;
};

}  // namespace cohort::launch
