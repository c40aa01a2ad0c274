#include "cohort/launch/spawn.h"

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cohort/core/error.h"

extern char** environ;

namespace cohort::launch {

std::string selfExecutable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find the cohort executable (/proc/self/exe)");
  buf[n] = '\0';
  return buf;
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return fmt::format("was killed by signal {} (SIG{})", sig, name ? name : "?");
  }
  return fmt::format("ended with status {}", status);
}

pid_t spawn(const std::string& exe, const std::vector<std::string>& args,
            const std::vector<std::string>* env, const sigset_t* mask, const char* what) {
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  if (env != nullptr) {
    for (const auto& e : *env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
  }
  const std::string failed = fmt::format("cohort: cannot execute {} ({})\n", what, exe);
  const pid_t parent = getpid();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) throw Error(fmt::format("cannot start {}: fork: {}", what, std::strerror(errno)));
  if (pid == 0) {
    // Child: die with the parent, take signals again, exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (mask != nullptr) sigprocmask(SIG_SETMASK, mask, nullptr);
    execve(exe.c_str(), argv.data(), env != nullptr ? envp.data() : environ);
    ssize_t ignored = write(STDERR_FILENO, failed.data(), failed.size());
    (void)ignored;
    _exit(127);
  }
  return pid;
}

}  // namespace cohort::launch
