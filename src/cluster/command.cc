#include "cohort/cluster/command.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "cohort/core/error.h"
#include "cohort/core/fd.h"

extern char** environ;

namespace cohort::cluster {
namespace {

using Clock = std::chrono::steady_clock;

// Moves what `fd` holds now into `into`; false at end of file.
bool drain(int fd, std::string& into) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && errno == EAGAIN;
  }
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

std::string CommandResult::describe(const std::string& program) const {
  std::string what = timedOut        ? program + " did not answer in time"
                     : exitCode < 0 ? program + " was killed by a signal"
                                    : fmt::format("{} exited with code {}", program, exitCode);
  const std::string said = trimmed(err.empty() ? out : err);
  return said.empty() ? what : what + ": " + said;
}

std::optional<std::string> findOnPath(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), X_OK) == 0) return program;
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

CommandResult runCommand(const std::vector<std::string>& argv, std::chrono::milliseconds limit) {
  if (argv.empty()) throw UsageError("runCommand: no program");
  const auto exe = findOnPath(argv[0]);
  if (!exe) {
    throw UsageError(fmt::format("{} is not on PATH: is this a Slurm login node? (PATH={})", argv[0],
                                 std::getenv("PATH") != nullptr ? std::getenv("PATH") : ""));
  }
  int outPipe[2], errPipe[2];
  if (::pipe2(outPipe, O_CLOEXEC) != 0) throw Error(fmt::format("pipe: {}", std::strerror(errno)));
  UniqueFd outRead(outPipe[0]), outWrite(outPipe[1]);
  if (::pipe2(errPipe, O_CLOEXEC) != 0) throw Error(fmt::format("pipe: {}", std::strerror(errno)));
  UniqueFd errRead(errPipe[0]), errWrite(errPipe[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(fmt::format("cannot start {}: fork: {}", argv[0], std::strerror(errno)));
  if (pid == 0) {
    const int devNull = ::open("/dev/null", O_RDONLY);
    if (devNull >= 0) ::dup2(devNull, STDIN_FILENO);
    ::dup2(outWrite.get(), STDOUT_FILENO);
    ::dup2(errWrite.get(), STDERR_FILENO);
    ::execve(exe->c_str(), args.data(), environ);
    _exit(127);
  }
  outWrite.reset();
  errWrite.reset();
  ::fcntl(outRead.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(errRead.get(), F_SETFL, O_NONBLOCK);
  CommandResult r;
  const auto deadline = Clock::now() + limit;
  bool outOpen = true, errOpen = true;
  while ((outOpen || errOpen) && Clock::now() < deadline) {
    pollfd fds[2] = {{outRead.get(), POLLIN, 0}, {errRead.get(), POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const int n = ::poll(fds, 2, static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(left.count(), 200))));
    if (n < 0 && errno != EINTR) break;
    if (outOpen && fds[0].revents != 0) outOpen = drain(outRead.get(), r.out);
    if (errOpen && fds[1].revents != 0) errOpen = drain(errRead.get(), r.err);
  }
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
    ::usleep(10000);
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    r.timedOut = true;
    return r;
  }
  if (done > 0 && WIFEXITED(status)) r.exitCode = WEXITSTATUS(status);
  return r;
}

}  // namespace cohort::cluster
