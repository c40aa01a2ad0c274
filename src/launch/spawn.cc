#include "cohort/launch/spawn.h"
#include "cohort/config/load.h"
#include "cohort/core/env.h"

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

std::string engineExecutable() {
  const std::string self = selfExecutable();
  const size_t slash = self.rfind('/');
  const std::string dir = self.substr(0, slash + 1), name = self.substr(slash + 1);
  if (name == kEngineProgram) return self;
  const std::string beside = dir + kEngineProgram;
  return access(beside.c_str(), X_OK) == 0 ? beside : self;
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

std::vector<std::string> rankEnvironment(const env::RankEnv& r, int restartCount,
                                         const UrlCredentials& credentials,
                                         const std::string& storeToken,
                                         const std::vector<std::pair<std::string, std::string>>& extra) {
  auto vars = env::rankVariables(r);
  vars.insert(vars.end(), extra.begin(), extra.end());
  vars.emplace_back(env::kStoreTokenVar, storeToken);
  // job.yaml, which the ranks read, holds no secret: they come this way.
  if (!credentials.empty()) {
    vars.emplace_back(env::kUrlCredentialsVar, encodeUrlCredentials(credentials));
  }
  vars.emplace_back("OMP_NUM_THREADS", "1");  // the rank sets its own thread count
  if (auto wait = env::rankOpenMpWait()) vars.push_back(*wait);
  vars.emplace_back("COHORT_RESTART_COUNT", std::to_string(restartCount));
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : vars) replaced = replaced || k == name;
    // Variables of other launchers would be read instead of ours.
    if (name.rfind("OMPI_COMM_WORLD_", 0) == 0 || name.rfind("SLURM_", 0) == 0) replaced = true;
    if (!replaced) out.push_back(entry);
  }
  for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
  return out;
}

}  // namespace cohort::launch
