#pragma once

// Ranks as forked children of the test process, for tests of code that runs
// between processes without the cohort binary (shared memory). As with
// test::Process: each child has a time limit, and whatever is still running
// when the test ends (a failed assertion, an exception) is SIGKILLed and
// reaped, so a failing test leaves no process behind.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cohort::test {

class ForkedRanks {
 public:
  // Exit code of a child still running at the time limit (then killed).
  static constexpr int kTimedOut = -1;

  // Runs `body(rank)` in `world` children; a child exits with what body
  // returns, or 3 after printing an exception it threw.
  template <typename F>
  ForkedRanks(int world, F body) {
    for (int r = 0; r < world; ++r) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        int code = 1;
        try {
          code = body(r);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
          code = 3;
        }
        std::_Exit(code);
      }
      if (pid < 0) {
        // Not every rank could start: stop the others, whose peer will never come.
        for (pid_t p : pids_) ::kill(p, SIGKILL);
        for (pid_t p : pids_) ::waitpid(p, nullptr, 0);
        throw std::runtime_error("fork failed for rank " + std::to_string(r));
      }
      pids_.push_back(pid);
    }
  }
  ~ForkedRanks() {
    for (pid_t p : pids_) ::kill(p, SIGKILL);
    for (pid_t p : pids_) ::waitpid(p, nullptr, 0);
  }
  ForkedRanks(const ForkedRanks&) = delete;
  ForkedRanks& operator=(const ForkedRanks&) = delete;

  // Waits for every child, at most `limit` in all; returns their exit codes
  // (128 + signal for a signal, kTimedOut for a child killed at the limit).
  std::vector<int> wait(std::chrono::milliseconds limit = std::chrono::minutes(2)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::vector<int> codes(pids_.size(), kTimedOut);
    std::vector<bool> done(pids_.size(), false);
    size_t left = pids_.size();
    while (left > 0 && std::chrono::steady_clock::now() < deadline) {
      for (size_t i = 0; i < pids_.size(); ++i) {
        int status = 0;
        if (done[i] || ::waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        done[i] = true;
        --left;
      }
      if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::vector<pid_t> running;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (!done[i]) running.push_back(pids_[i]);
    }
    pids_ = running;  // the destructor kills and reaps these
    return codes;
  }

 private:
  std::vector<pid_t> pids_;
};

// Forks `world` ranks running `body(rank)` and returns their exit codes.
template <typename F>
std::vector<int> forkRanks(int world, F body, std::chrono::milliseconds limit = std::chrono::minutes(2)) {
  ForkedRanks ranks(world, body);
  return ranks.wait(limit);
}

}  // namespace cohort::test
