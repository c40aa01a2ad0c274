#include "cohort/launch/launcher.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "cohort/config/load.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/run_dir.h"

extern char** environ;

namespace cohort::launch {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return fmt::format("was killed by signal {} (SIG{})", sig, name ? name : "?");
  }
  return fmt::format("ended with status {}", status);
}

// Failures whose cause is elsewhere (a peer's death seen as a network error,
// our own SIGTERM) rank below those that are a cause themselves.
int severity(int status) {
  if (WIFSIGNALED(status)) return WTERMSIG(status) == SIGTERM ? 1 : 3;
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    if (code == 0) return 0;
    if (code == 128 + SIGTERM || code == 128 + SIGINT) return 1;
    return code == 1 ? 2 : 3;
  }
  return 2;
}

// The environment block of one rank, built before fork: the child only calls
// async-signal-safe functions until exec.
std::vector<std::string> rankEnvironment(const env::RankEnv& r) {
  std::vector<std::string> out;
  auto vars = env::rankVariables(r);
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : vars) replaced = replaced || k == name;
    // Variables of other launchers would be read instead of ours.
    if (name.rfind("OMPI_COMM_WORLD_", 0) == 0 || name.rfind("SLURM_", 0) == 0) replaced = true;
    if (!replaced) out.push_back(entry);
  }
  for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
  out.push_back("OMP_NUM_THREADS=1");  // the rank sets its own thread count
  return out;
}

pid_t spawn(const std::string& exe, const std::vector<std::string>& args,
            const std::vector<std::string>& envBlock, const sigset_t& originalMask) {
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : envBlock) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw Error(fmt::format("cannot start a rank: fork: {}", std::strerror(errno)));
  if (pid == 0) {
    // Child: die with the launcher, take signals again, become the worker.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    sigprocmask(SIG_SETMASK, &originalMask, nullptr);
    execve(exe.c_str(), argv.data(), envp.data());
    const char msg[] = "cohort: cannot execute the worker binary\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    _exit(127);
  }
  return pid;
}

std::string selfExecutable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find the cohort executable (/proc/self/exe)");
  buf[n] = '\0';
  return buf;
}

}  // namespace

int runLauncher(const LaunchOptions& o) {
  log::Options lo;
  lo.tag = "launcher";
  log::init(lo);

  JobConfig job = loadJob(o.jobPath, o.overrides);
  if (o.procs < 0) throw UsageError(fmt::format("--procs must be >= 1, got {}", o.procs));
  if (o.procs > 0) job.distribution.procsPerNode = o.procs;
  if (job.distribution.nodes != 1) {
    throw ConfigError(fmt::format(
        "distribution.nodes is {}: `cohort run` starts the ranks of one machine; start a "
        "multi-machine job with mpirun or srun running `cohort worker` (see docs/launching.md)",
        job.distribution.nodes));
  }
  const int world = static_cast<int>(job.distribution.procsPerNode);
  const RunDir runDir = o.runDir.empty() ? createDefaultRunDir(job) : openRunDir(o.runDir);
  writeFileAtomic(runDir.jobFile(), toYaml(job));
  lo.file = runDir.launcherLog();
  log::init(lo);

  // Signals are taken synchronously below (sigtimedwait), never by a handler.
  sigset_t watched, original;
  sigemptyset(&watched);
  sigaddset(&watched, SIGCHLD);
  sigaddset(&watched, SIGINT);
  sigaddset(&watched, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &watched, &original);

  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(job.distribution.masterPort);
    so.isServer = true;
    so.waitWorkers = false;
    so.timeout = std::chrono::milliseconds(static_cast<int64_t>(job.distribution.timeoutS * 1000));
    store = c10::make_intrusive<c10d::TCPStore>(job.distribution.masterAddr, so);
  } catch (const std::exception& e) {
    pthread_sigmask(SIG_SETMASK, &original, nullptr);
    throw CommError(fmt::format("cannot host the rendezvous store on {}:{}: {}",
                                job.distribution.masterAddr, job.distribution.masterPort, e.what()));
  }

  const std::string exe = o.executable.empty() ? selfExecutable() : o.executable;
  log::info("starting {} ranks of job '{}'; run directory {}", world, job.name, runDir.root);
  log::debug("rendezvous store {}:{}", job.distribution.masterAddr, store->getPort());

  std::vector<Child> children(static_cast<size_t>(world));
  std::optional<Clock::time_point> killAt;
  bool stopping = false;
  int interruptSignal = 0;

  auto stopAll = [&](const char* why) {
    if (stopping) return;
    stopping = true;
    log::debug("stopping every rank: {}", why);
    for (auto& c : children) {
      if (c.running) kill(c.pid, SIGTERM);
    }
    killAt = Clock::now() + o.termGrace;
  };

  try {
    for (int r = 0; r < world; ++r) {
      env::RankEnv re;
      re.rank = r;
      re.worldSize = world;
      re.localRank = r;
      re.localWorldSize = world;
      re.masterAddr = job.distribution.masterAddr;
      re.masterPort = store->getPort();
      re.agentStore = true;
      auto& c = children[static_cast<size_t>(r)];
      c.rank = r;
      c.pid = spawn(exe, {exe, "worker", runDir.jobFile(), "--run-dir", runDir.root},
                    rankEnvironment(re), original);
      c.running = true;
      log::debug("rank {} is pid {}", r, c.pid);
    }
  } catch (...) {
    stopAll("a rank could not be started");
    for (auto& c : children) {
      if (c.running) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
      }
    }
    pthread_sigmask(SIG_SETMASK, &original, nullptr);
    throw;
  }

  std::optional<Child> cause;
  for (;;) {
    // Reap everything that ended; pick the most telling failure as the cause.
    for (;;) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (auto& c : children) {
        if (c.pid != pid || !c.running) continue;
        c.running = false;
        c.status = status;
        const int sev = severity(status);
        if (sev == 0) {
          log::debug("rank {} finished", c.rank);
          continue;
        }
        log::debug("rank {} {}", c.rank, describeStatus(status));
        if (!cause || sev > severity(cause->status)) cause = c;
        stopAll("a rank failed");
      }
    }
    bool anyRunning = false;
    for (const auto& c : children) anyRunning = anyRunning || c.running;
    if (!anyRunning) break;

    if (killAt && Clock::now() >= *killAt) {
      for (auto& c : children) {
        if (c.running) {
          log::warn("rank {} did not stop within {} ms of SIGTERM: sending SIGKILL", c.rank,
                    o.termGrace.count());
          kill(c.pid, SIGKILL);
        }
      }
      killAt = Clock::now() + std::chrono::hours(1);
    }

    timespec timeout{0, 100 * 1000 * 1000};
    siginfo_t info;
    const int sig = sigtimedwait(&watched, &info, &timeout);
    if (sig == SIGINT || sig == SIGTERM) {
      if (interruptSignal != 0) {
        for (auto& c : children) {
          if (c.running) kill(c.pid, SIGKILL);
        }
      } else {
        interruptSignal = sig;
        log::warn("received {}: stopping every rank", sig == SIGINT ? "SIGINT" : "SIGTERM");
        stopAll("interrupted");
      }
    }
  }
  // A Ctrl-C on the terminal reaches the ranks and the launcher together;
  // take a signal still pending so it is reported, not acted on later.
  {
    timespec zero{0, 0};
    siginfo_t info;
    for (int sig; (sig = sigtimedwait(&watched, &info, &zero)) > 0;) {
      if ((sig == SIGINT || sig == SIGTERM) && interruptSignal == 0) interruptSignal = sig;
    }
  }
  pthread_sigmask(SIG_SETMASK, &original, nullptr);

  if (cause && (severity(cause->status) >= 2 || interruptSignal == 0)) {
    const int code = WIFEXITED(cause->status) ? WEXITSTATUS(cause->status) : 0;
    log::error("rank {} (pid {}) {}; stopped the other ranks. Its log: {}", cause->rank, cause->pid,
               describeStatus(cause->status), runDir.rankLog(cause->rank));
    return code == 2 ? 2 : 1;
  }
  if (interruptSignal != 0) {
    log::error("interrupted: every rank stopped; outputs so far are in {}", runDir.root);
    return 128 + interruptSignal;
  }
  log::debug("all {} ranks finished", world);
  return 0;
}

}  // namespace cohort::launch
