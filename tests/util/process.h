#pragma once

// Real processes for tests: run a command (typically the cohort binary) in
// its own process group, capture its output, bound how long it may run, and
// SIGKILL the whole group on destruction so a failing test leaks nothing.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace cohort::test {

struct ProcessResult {
  int exitCode = -1;    // when it exited normally
  int signal = 0;       // when a signal ended it
  bool timedOut = false;
  std::string out;      // stdout
  std::string err;      // stderr
  double seconds = 0;
  std::string describe() const;  // for assertion messages
};

class Process {
 public:
  // Starts argv[0] (a path) with the current environment plus `env`.
  Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~Process();  // SIGKILLs the process group if still running, and reaps
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  // Waits until `limit` after the process started; past it, SIGKILLs the
  // group and sets timedOut.
  ProcessResult wait(std::chrono::milliseconds limit);
  // Whether it has exited (not reaped: wait() collects it).
  bool exited() const;
  // Output collected so far (drains the pipes without blocking).
  std::string stderrSoFar();
  std::string stdoutSoFar();
  void signal(int sig);
  // Pids of direct children of this process (from /proc).
  std::vector<pid_t> children() const;

 private:
  void drain(int timeoutMs);
  pid_t pid_ = -1;
  int outFd_ = -1, errFd_ = -1;
  bool reaped_ = false;
  std::string out_, err_;
  std::chrono::steady_clock::time_point start_;
};

// Runs to completion (or `limit`).
ProcessResult run(const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env = {},
                  std::chrono::milliseconds limit = std::chrono::minutes(5));

// Polls `ready` every 50 ms until it is true or `limit` passes.
bool waitUntil(const std::function<bool()>& ready, std::chrono::milliseconds limit);

// Pids of processes whose environment holds `marker` (NAME=value).
std::vector<pid_t> processesWithEnv(const std::string& marker);

// The pids waiting at pause point `point` of COHORT_TEST_PAUSE (core/env.h)
// whose directory is `dir`; <dir>/<point>.go lets them go on.
std::vector<pid_t> pausedAt(const std::string& dir, const std::string& point);

// Whether signal `sig` waits, blocked, for process `pid` (/proc/<pid>/status).
bool signalPending(pid_t pid, int sig);

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes a text file.
void writeText(const std::string& path, const std::string& text);
std::string readText(const std::string& path);

// A free TCP port (cohort::freeTcpPort: below the ephemeral range, so no
// connection the suite opens takes it before the test's server binds it).
int freePort();

}  // namespace cohort::test
