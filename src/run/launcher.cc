#include "cohort/run/launcher.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/resume.h"

#include "cohort/comm/store.h"
#include "cohort/config/load.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/exit_codes.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/memory_limit.h"
#include "cohort/core/run_dir.h"
#include "cohort/monitor/prometheus.h"
#include "cohort/launch/debug.h"
#include "cohort/launch/spawn.h"
#include "cohort/launch/supervisor.h"
#include "cohort/run/run_metrics.h"
#include "cohort/core/signals.h"
#include "cohort/security/keys.h"

extern char** environ;

namespace cohort::run {

using launch::describeStatus;
using launch::rankEnvironment;
using launch::engineExecutable;
using launch::Supervisor;

namespace {

using Child = Supervisor::Child;

bool stoppedAfterCheckpoint(const Child& c) {
  return !c.killedByUs && WIFEXITED(c.status) &&
         WEXITSTATUS(c.status) == kExitStoppedAfterCheckpoint;
}

// How telling a rank's end is as the cause of a failed job: a signal or an
// unusual exit code is a cause (3); exit 1 is often a rank that only saw a
// peer disappear (2); ends we or a Ctrl-C brought about come last (1).
int severity(const Child& c) {
  const int status = c.status;
  if (c.killedByUs) return 1;
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return sig == SIGTERM || sig == SIGINT ? 1 : 3;
  }
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    if (code == 0) return 0;
    if (code == exitCodeForSignal(SIGTERM) || code == exitCodeForSignal(SIGINT)) return 1;
    if (code == kExitStoppedAfterCheckpoint) return 1;
    return code == 1 ? 2 : 3;
  }
  return 2;
}

// Inherited "ignore SIGCHLD" would make the kernel reap the ranks behind our
// back and waitpid fail: take the default disposition.
void defaultSigchld() {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGCHLD, &dfl, nullptr);
}

// The newest run directory of this job under output.dir that did not
// complete and holds a committed checkpoint: rerunning a command resumes it.
std::optional<std::string> findInterruptedRun(const JobConfig& job) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> candidates;
  for (const auto& e : fs::directory_iterator(job.output.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(job.name + "-", 0) == 0 && e.is_directory(ec)) candidates.push_back(e.path().string());
  }
  std::sort(candidates.rbegin(), candidates.rend());  // the names carry the UTC start time
  const std::string hash = jobHash(job);
  for (const auto& dir : candidates) {
    try {
      const RunDir rd{dir};
      std::ifstream summary(rd.summary());
      if (summary) {
        const auto j = nlohmann::json::parse(summary, nullptr, false);
        if (j.is_object() && j.value("status", "") == "completed") continue;
      }
      std::ifstream jobFile(rd.jobFile());
      if (!jobFile) continue;
      std::stringstream text;
      text << jobFile.rdbuf();
      if (jobHash(loadJobFromString(text.str(), rd.jobFile())) != hash) continue;
      if (ckpt::newestValidCheckpoint(ckpt::checkpointDir(job, rd))) return dir;
    } catch (const std::exception&) {
      continue;  // a run directory we cannot read is not one to resume
    }
  }
  return std::nullopt;
}

struct Attempt {
  int code = 0;
  bool restartable = false;
  std::string cause;
};

// Adds the launcher's record of restarts to the run's summary.json.
void recordRestarts(const RunDir& runDir, const std::vector<std::string>& causes) {
  if (causes.empty()) return;
  std::ifstream in(runDir.summary());
  if (!in) return;
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object()) return;
  j["restart_causes"] = causes;
  writeFileAtomic(runDir.summary(), j.dump(2) + "\n");
}

// What every attempt of a run needs.
struct AttemptSetup {
  const LaunchOptions& o;
  const JobConfig& job;
  const RunDir& runDir;
  const std::string& exe;
  BlockedSignals& signals;  // SIGCHLD, SIGINT, SIGTERM, taken between polls
  int world;
  int storePort;
  const UrlCredentials& credentials;
  const std::string& storeToken;
  std::chrono::milliseconds stopGrace;  // distribution.stop_timeout_s
  const std::vector<std::pair<std::string, std::string>>& debugVars;  // launch/debug.h
};

// One attempt: start every rank, watch them, stop them all when one fails,
// and say how it ended.
class AttemptRun {
 public:
  AttemptRun(const AttemptSetup& s, int attempt) : s_(s), attempt_(attempt) {}
  Attempt run();

 private:
  void startRanks();
  // SIGTERM every rank (unless `signal` is false: they are stopping on their
  // own) and SIGKILL what is left `within` from now.
  void stopAll(const char* why, std::chrono::milliseconds within, bool signal = true);
  void ended(const Child& c);
  void onSignal(int sig);
  Attempt outcome() const;

  const AttemptSetup& s_;
  const int attempt_;
  Supervisor ranks_;
  bool stopping_ = false;
  int interruptSignal_ = 0;
  std::optional<Child> cause_;
  std::vector<int> lost_;  // ranks whose end could not be observed
  // The OOM killer's count in this process's memory cgroup at the start, to
  // tell an out-of-memory SIGKILL from any other.
  std::optional<uint64_t> oomKillsBefore_ = memory::oomKills();
};

namespace {

// " (out of memory: ...)" when the OOM killer killed a process of this
// cgroup since `before`, else "".
std::string outOfMemory(const Child& c, std::optional<uint64_t> before) {
  if (!WIFSIGNALED(c.status) || WTERMSIG(c.status) != SIGKILL || !before) return "";
  const std::optional<uint64_t> now = memory::oomKills();
  if (!now || *now <= *before) return "";
  const memory::Limit limit = memory::processLimit();
  return fmt::format(", sent by the kernel's out-of-memory killer{}; distribution.zero shards the "
                     "training state over the ranks (docs/zero.md)",
                     limit.bytes == 0 ? std::string()
                                      : fmt::format(" (the job's memory limit is {} MB, from {})",
                                                    limit.bytes >> 20, limit.source));
}

}  // namespace

void AttemptRun::startRanks() {
  const JobConfig& job = s_.job;
  // A stop sent while a rank loads waits for its signal thread (core/signals.h).
  const sigset_t rankMask = withRankStopSignals(s_.signals.original());
  for (int r = 0; r < s_.world; ++r) {
    env::RankEnv re;
    re.rank = r;
    re.worldSize = s_.world;
    re.localRank = r;
    re.localWorldSize = s_.world;
    re.masterAddr = job.distribution.masterAddr;
    re.masterPort = s_.storePort;
    re.agentStore = true;
    std::vector<std::string> args = {s_.exe, "worker", s_.runDir.jobFile(), "--run-dir",
                                      s_.runDir.root};
    if (!s_.o.resume.empty()) {
      args.push_back("--resume");
      args.push_back(s_.o.resume);
    }
    const auto envBlock = rankEnvironment(re, attempt_, s_.credentials, s_.storeToken, s_.debugVars);
    ranks_.start(r, s_.exe, args, &envBlock, &rankMask, "the worker binary");
    log::debug("rank {} is pid {}", r, ranks_.children().back().pid);
  }
}

void AttemptRun::stopAll(const char* why, std::chrono::milliseconds within, bool signal) {
  if (stopping_) return;
  stopping_ = true;
  log::debug("stopping every rank: {}", why);
  ranks_.stop(signal ? SIGTERM : 0, within);
}

// Keeps the most telling failure as the cause.
void AttemptRun::ended(const Child& c) {
  const int sev = severity(c);
  if (sev == 0) {
    log::debug("rank {} finished", c.rank);
    return;
  }
  log::debug("rank {} {}", c.rank, describeStatus(c.status));
  if (!cause_ || sev > severity(*cause_)) cause_ = c;
  if (stoppedAfterCheckpoint(c)) {
    // One rank was told to stop (SIGTERM): the others stop at the same step
    // on their own; give them the time to checkpoint.
    stopAll("a rank stopped after a checkpoint", s_.stopGrace, false);
  } else {
    stopAll("a rank failed", s_.o.termGrace);
  }
}

void AttemptRun::onSignal(int sig) {
  if (sig != SIGINT && sig != SIGTERM) return;
  const JobConfig& job = s_.job;
  const bool graceful = interruptSignal_ == SIGTERM && job.checkpoint.enabled;
  if (interruptSignal_ != 0 && (sig == SIGINT || !graceful)) {
    ranks_.stop(SIGKILL, std::chrono::milliseconds(0));  // a second signal: no more grace
  } else if (interruptSignal_ != 0) {
    log::debug("SIGTERM again: the ranks are already stopping after a checkpoint");
  } else {
    interruptSignal_ = sig;
    if (sig == SIGTERM && job.checkpoint.enabled) {
      log::warn("received SIGTERM: every rank finishes its step, writes a checkpoint and stops "
                "(within distribution.stop_timeout_s = {} s)",
                job.distribution.stopTimeoutS);
      stopAll("SIGTERM", s_.stopGrace);
    } else {
      log::warn("received {}: stopping every rank", sig == SIGINT ? "SIGINT" : "SIGTERM");
      stopAll("interrupted", s_.o.termGrace);
    }
  }
}

// A stop taken while no rank runs (before the first attempt, or between
// two): nothing is newer than the newest checkpoint, so SIGTERM with
// checkpoints on ends as a stop after a checkpoint (exit 75: rerun, or
// requeue, to resume); SIGINT, or SIGTERM without checkpoints, as an
// interruption.
std::optional<int> stopBeforeRanks(BlockedSignals& signals, const JobConfig& job) {
  for (int sig; (sig = signals.wait(std::chrono::milliseconds(0))) != 0;) {
    if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD of ranks already reaped
    if (sig == SIGTERM && job.checkpoint.enabled) {
      log::warn("received SIGTERM while no rank runs: nothing new to save; rerun the same command "
                "to resume (exit code {})",
                kExitStoppedAfterCheckpoint);
      return kExitStoppedAfterCheckpoint;
    }
    log::warn("received {} while no rank runs: stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    return exitCodeForSignal(sig);
  }
  return std::nullopt;
}

Attempt AttemptRun::run() {
  try {
    startRanks();
  } catch (...) {
    ranks_.killAll();  // the Supervisor reaps them
    throw;
  }
  Supervisor::Watch w;
  w.ended = [this](const Child& c) { ended(c); };
  w.lost = [this](int rank) { lost_.push_back(rank); };
  w.wait = [this](std::chrono::milliseconds poll) { onSignal(s_.signals.wait(poll)); };
  w.poll = std::chrono::milliseconds(100);
  ranks_.watch(w);
  // A Ctrl-C on the terminal reaches the ranks and the launcher together;
  // take a signal still pending so it is reported, not acted on later.
  for (int sig; (sig = s_.signals.wait(std::chrono::milliseconds(0))) != 0;) {
    if ((sig == SIGINT || sig == SIGTERM) && interruptSignal_ == 0) interruptSignal_ = sig;
  }
  return outcome();
}

Attempt AttemptRun::outcome() const {
  const auto& children = ranks_.children();
  Attempt a;
  bool allCompleted = lost_.empty();
  for (const auto& c : children) {
    allCompleted = allCompleted && !c.killedByUs && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
  }
  if (allCompleted) {
    // A signal that came after the last step boundary changed nothing.
    if (interruptSignal_ != 0) log::info("every rank had completed when the signal arrived");
    return a;
  }
  bool allStopped = true;
  for (const auto& c : children) allStopped = allStopped && stoppedAfterCheckpoint(c);
  if (allStopped) {
    log::warn("every rank stopped after writing a checkpoint; rerun the same command to resume "
              "(exit code {})",
              kExitStoppedAfterCheckpoint);
    a.code = kExitStoppedAfterCheckpoint;
    return a;
  }
  if (cause_ && (severity(*cause_) >= 2 || interruptSignal_ == 0)) {
    const int code = WIFEXITED(cause_->status) ? WEXITSTATUS(cause_->status) : 0;
    a.cause = fmt::format("rank {} (pid {}) {}{}", cause_->rank, cause_->pid,
                          describeStatus(cause_->status), outOfMemory(*cause_, oomKillsBefore_));
    a.code = code == 2 ? 2 : 1;
    // Bad input (2), divergence (3) and a failed preflight check (5) would
    // fail the same way again.
    a.restartable = code != 2 && code != 3 && code != 5 && interruptSignal_ == 0;
    log::error("{}; stopped the other ranks. Its log: {}", a.cause, s_.runDir.rankLog(cause_->rank));
    return a;
  }
  if (interruptSignal_ != 0) {
    log::error("interrupted: every rank stopped; outputs so far are in {}", s_.runDir.root);
    a.code = exitCodeForSignal(interruptSignal_);
    return a;
  }
  if (!lost_.empty()) {
    a.cause = fmt::format("lost track of ranks [{}]: their exit status could not be collected",
                          fmt::join(lost_, ", "));
    log::error("{}", a.cause);
    a.code = 1;
    a.restartable = true;
    return a;
  }
  log::debug("all {} ranks finished", s_.world);
  return a;
}

}  // namespace

int runLauncher(const LaunchOptions& o) {
  log::Options lo;
  lo.tag = "launcher";
  log::init(lo);

  JobConfig job = loadJob(o.jobPath, o.overrides);
  if (o.procs < 0) throw UsageError(fmt::format("--procs must be >= 1, got {}", o.procs));
  if (o.procs > 0) job.distribution.procsPerNode = o.procs;
  checkRanks(job, requestedWorldSize(job));
  if (job.distribution.nodes != 1) {
    throw ConfigError(fmt::format(
        "distribution.nodes is {}: `cohort run` starts the ranks of one machine; start a "
        "multi-machine job with `cohort agent` on every machine (docs/elastic.md), or with "
        "mpirun or srun running `cohort worker` (docs/launching.md)",
        job.distribution.nodes));
  }
  if (!o.resume.empty() && !std::filesystem::is_directory(o.resume)) {
    throw UsageError(fmt::format("--resume {}: no such directory", o.resume));
  }
  const int world = static_cast<int>(job.distribution.procsPerNode);
  // --debug ranks checked, gdbserver found: before anything is written.
  const auto debugVars = launch::debugEnvironment(o.debug, world);
  // --plan: checked now, kept in the run directory for the summary.
  std::string planText;
  if (!o.plan.empty()) {
    planText = readFile(o.plan);
    const auto plan = nlohmann::json::parse(planText, nullptr, false);
    if (plan.is_discarded() || !plan.is_object() || !plan.contains("predicted")) {
      throw ConfigError(fmt::format("--plan {}: not what `cohort plan --json` writes (no \"predicted\")", o.plan));
    }
  }
  // A missing or unreadable key fails here, before any rank starts.
  security::loadKeyring(security::keySources(job.security.encryption));
  const UrlCredentials credentials = [&] {
    JobConfig copy = job;
    return takeUrlCredentials(copy);
  }();
  // The ranks need LibTorch: cohort-torch, without passing through the front end.
  const std::string exe = o.executable.empty() ? engineExecutable() : o.executable;

  // Signals first, so the store's thread inherits the blocked mask; the store
  // before the run directory, so a busy port leaves nothing behind.
  // Blocked for the launcher's lifetime, taken synchronously between polls.
  defaultSigchld();
  BlockedSignals signals({SIGCHLD, SIGINT, SIGTERM});
  // The job's token, or one made for this run: the ranks get it in their
  // environment, and nothing else on the machine can use the store.
  std::string storeToken = security::storeToken(job.security.storeTokenFile);
  if (storeToken.empty()) storeToken = comm::newStoreToken();
  comm::StoreServerOptions storeOptions;
  storeOptions.addr = job.distribution.masterAddr;
  storeOptions.port = static_cast<int>(job.distribution.masterPort);
  storeOptions.token = storeToken;
  comm::StoreServer store(storeOptions);
  std::optional<std::string> interrupted;
  if (o.runDir.empty() && !o.newRun && job.checkpoint.enabled) interrupted = findInterruptedRun(job);
  const RunDir runDir = !o.runDir.empty()  ? openRunDir(o.runDir)
                        : interrupted      ? openRunDir(*interrupted)
                                           : createDefaultRunDir(job.output.dir, job.name);
  writeFileAtomic(runDir.jobFile(), toYaml(job));
  if (!planText.empty()) writeFileAtomic(runDir.plan(), planText);
  lo.file = runDir.launcherLog();
  log::init(lo);
  if (interrupted) {
    log::info("resuming the interrupted run {} (cohort run --new-run starts a new one)",
              runDir.root);
  }
  if (!credentials.empty()) {
    log::warn("{} URL(s) of the job carry a SAS token: it is kept out of job.yaml, logs and "
              "checkpoints, but a job file is easily shared; prefer AZURE_STORAGE_SAS_TOKEN or "
              "storage.credentials_file (docs/security.md)",
              credentials.size());
  }
  log::info("starting {} ranks of job '{}'; run directory {}", world, job.name, runDir.root);
  log::debug("rendezvous store {}:{}", job.distribution.masterAddr, store.port());
  const auto stopGrace =
      std::chrono::milliseconds(static_cast<int64_t>(job.distribution.stopTimeoutS * 1000));
  // output.metrics_port: Prometheus scrapes the run here while it lasts.
  RunMetrics runMetrics(job, runDir, store.table());
  std::unique_ptr<monitor::MetricsServer> metricsServer;
  if (job.output.metricsPort > 0) {
    metricsServer = std::make_unique<monitor::MetricsServer>(
        metricsServerConfig(job.output),
        [&runMetrics] { return runMetrics.render(); });
    metricsServer->start();
    log::info("Prometheus metrics at {}://{}/metrics{}", job.output.metricsTlsCert.empty() ? "http" : "https",
              metricsServer->address(), job.output.metricsTokenFile.empty() ? "" : " (bearer token)");
  }

  const AttemptSetup setup{o,     job,   runDir, exe, signals, world, store.port(), credentials,
                           storeToken, stopGrace, debugVars};
  std::vector<std::string> causes;
  env::pauseForTest("launcher");
  for (int attempt = 0;; ++attempt) {
    if (const auto code = stopBeforeRanks(signals, job)) {
      recordRestarts(runDir, causes);
      return *code;
    }
    runMetrics.setAttempt(attempt);
    const Attempt a = AttemptRun(setup, attempt).run();
    if (a.code == 0 || !a.restartable || attempt >= job.distribution.maxRestarts) {
      if (a.restartable && job.distribution.maxRestarts > 0) {
        log::error("giving up after {} restarts (distribution.max_restarts)", attempt);
      }
      recordRestarts(runDir, causes);
      return a.code;
    }
    causes.push_back(a.cause);
    log::warn("restart {} of at most {}: starting every rank again from the newest checkpoint "
              "(cause: {})",
              attempt + 1, job.distribution.maxRestarts, a.cause);
  }
}

}  // namespace cohort::run
