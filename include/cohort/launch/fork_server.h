#pragma once

// Ranks forked from a process that has LibTorch loaded already.
//
// Loading LibTorch costs a process about 0.4 s of CPU (the dynamic loader
// relocating some 290 libraries, the operator registry filling itself),
// paid again by every rank of every attempt. The first rank a Supervisor
// starts with cohort-torch starts a fork server instead: cohort-torch
// --fork-server, which loads LibTorch once, creates no thread and waits on
// a socket. For each rank it forks, and the fork becomes the rank: it takes
// the request's arguments, environment, signal mask, working directory and
// standard streams (passed as file descriptors), then runs cohort-torch's
// main as a started program would. To make the rank this process's own
// child (waitpid, SIGCHLD, the supervisor's stop policy), the server forks
// twice and this process is a child subreaper (PR_SET_CHILD_SUBREAPER): the
// rank is reparented here when the middle process exits, and only then
// sets PR_SET_PDEATHSIG, so that it dies with this process as a spawned
// rank does.
//
// Each rank's command line and environment are written over the server's
// (which is started with room to spare), so that ps and /proc/PID/environ
// show the rank's own; a rank whose do not fit is started by exec.
//
// The server dies with this process and exits when the socket closes. When
// it cannot start or stops answering, ranks are spawned (fork and exec) as
// before, with a warning. COHORT_FORK_SERVER=0 turns it off
// (docs/launching.md).

#include <signal.h>
#include <sys/types.h>

#include <mutex>
#include <string>
#include <vector>

namespace cohort::launch {

// The first argument that makes cohort-torch a fork server.
inline constexpr const char* kForkServerArg = "--fork-server";
// Its socket's file descriptor, in the server's environment.
inline constexpr const char* kForkServerFdVar = "COHORT_FORK_SERVER_FD";
// "0" turns the fork server off.
inline constexpr const char* kForkServerVar = "COHORT_FORK_SERVER";

class ForkServer {
 public:
  // The server for `exe` in this process, started by the first call;
  // nullptr when `exe` is not cohort-torch, COHORT_FORK_SERVER=0, or the
  // server failed (then it is not tried again).
  static ForkServer* forEngine(const std::string& exe);

  ~ForkServer();
  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;

  // Starts a rank as spawn() would: `args` (argv[0] included), `env`
  // (nullptr: this process's), `mask` (nullptr: this process's). Returns
  // its pid, a child of this process, or -1 when the server failed (it is
  // then stopped, and the caller spawns the rank itself).
  pid_t start(const std::vector<std::string>& args, const std::vector<std::string>* env, const sigset_t* mask);

  pid_t pid() const { return pid_; }

 private:
  ForkServer(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void stop();

  std::mutex mutex_;
  pid_t pid_;
  int fd_;
};

// In a rank the fork server forked: the server's pid; 0 elsewhere.
pid_t forkServerOfThisRank();

// The server's side: what cohort-torch runs when its first argument is
// kForkServerArg, with its own `argc` and `argv`. `main` is the program's
// main, which each fork runs. Returns when the socket closes.
using ProgramMain = int (*)(int, char**);
int serveForks(int argc, char** argv, ProgramMain main);

}  // namespace cohort::launch
