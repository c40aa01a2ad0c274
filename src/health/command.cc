// `cohort health`: the health checks on N local ranks, stand-alone.
//
// The command hosts a rendezvous store on 127.0.0.1 and starts N copies of
// itself (`cohort health ... --rank R --store-port P`); each joins the
// process group, runs the checks and gathers every rank's report; rank 0
// prints them. The command only watches: a rank that ends abnormally is
// named and the others are killed.

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "cohort/comm/comm.h"
#include "cohort/config/load.h"
#include "cohort/core/cpu.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/health/ceiling.h"
#include "cohort/health/health.h"
#include "cohort/launch/spawn.h"
#include "cohort/launch/supervisor.h"
#include "cohort/security/keys.h"

extern char** environ;

namespace cohort::health {
namespace {

using Clock = std::chrono::steady_clock;

// How a rank process ends: 0 every check passed, 1 a check failed (rank 0
// printed why), 2 bad input, kRankError any other error (the rank logged it).
// Only 0 and 1 mean the rank completed; on anything else the others are
// stopped at once rather than left waiting for it.
constexpr int kRankError = 4;

// Without a job file every key takes its default; the schema only insists on
// training data, which the checks never read.
JobConfig loadHealthJob(const HealthCommandOptions& o) {
  if (!o.jobPath.empty()) return loadJob(o.jobPath, o.overrides);
  return loadJobFromString("data:\n  train:\n    kind: synthetic\n", "(no job file)", o.overrides);
}

int ranksOf(const HealthCommandOptions& o, const JobConfig& job) {
  return o.procs > 0 ? o.procs : static_cast<int>(job.distribution.procsPerNode);
}

// Stand-alone there is no run directory: the disk check writes where run
// directories would go.
std::string diskDirOf(const JobConfig& job) {
  return job.health.diskDir.empty() ? job.output.dir : job.health.diskDir;
}

// Whether the CPU has bfloat16 products (training.precision auto picks bf16 there).
bool bf16Kernels() {
  const CpuInfo cpu = cpuInfo();
  for (const std::string& f : cpu.features) {
    if (f == "avx512_bf16" || f == "amx_bf16") return true;
  }
  return false;
}

std::chrono::milliseconds timeoutOf(const JobConfig& job) {
  return std::chrono::milliseconds(static_cast<int64_t>(job.distribution.timeoutS * 1000));
}

}  // namespace

int healthCommand(const HealthCommandOptions& o) {
  log::Options lo;
  lo.tag = "health";
  log::init(lo);

  const JobConfig job = loadHealthJob(o);
  const int world = ranksOf(o, job);
  if (world < 1) throw UsageError(fmt::format("--procs must be >= 1, got {}", world));
  const std::string exe = o.executable.empty() ? launch::selfExecutable() : o.executable;
  if (job.health.diskDir.empty()) {
    // As `cohort run` would; a failure shows in the disk check, naming the path.
    std::error_code ec;
    std::filesystem::create_directories(job.output.dir, ec);
  }

  // An inherited "ignore SIGCHLD" would have the kernel reap the ranks and
  // waitpid fail.
  signal(SIGCHLD, SIG_DFL);
  const auto timeout = timeoutOf(job);
  // The ranks inherit COHORT_STORE_TOKEN, or read the same token file.
  const comm::HostedStore store = comm::hostStore(
      "127.0.0.1", 0, timeout, security::storeToken(job.security.storeTokenFile));
  log::debug("health checks: {} ranks, store 127.0.0.1:{}", world, store.port);

  launch::Supervisor ranks;  // kills and reaps what is left, whatever happens
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args = {exe, "health"};
    if (!o.jobPath.empty()) args.push_back(o.jobPath);
    for (const auto& s : o.overrides) {
      args.push_back("--set");
      args.push_back(s);
    }
    if (o.json) args.push_back("--json");
    for (const auto& [flag, value] : {std::pair<const char*, int>{"--procs", world},
                                      {"--rank", r},
                                      {"--store-port", store.port}}) {
      args.push_back(flag);
      args.push_back(std::to_string(value));
    }
    ranks.start(r, exe, args, nullptr, nullptr, "the cohort binary for a health rank");
  }

  // Each rank bounds its own waits by distribution.timeout_s; this is the
  // backstop for a rank that hangs regardless.
  const auto limit = std::chrono::duration_cast<std::chrono::seconds>(2 * timeout) +
                     std::chrono::seconds(60);
  const auto deadline = Clock::now() + limit;
  std::optional<launch::Supervisor::Child> cause;
  bool timedOut = false;
  const auto now = std::chrono::milliseconds(0);
  launch::Supervisor::Watch w;
  w.ended = [&](const launch::Supervisor::Child& c) {
    const bool clean = WIFEXITED(c.status) && (WEXITSTATUS(c.status) == 0 || WEXITSTATUS(c.status) == 1);
    if (clean) return;
    log::debug("rank {} (pid {}) {}", c.rank, c.pid, launch::describeStatus(c.status));
    if (!cause) {
      cause = c;
      ranks.stop(SIGKILL, now);  // nothing to save: the checks are simply stopped
    }
  };
  w.lost = [&](int rank) {
    if (cause) return;
    cause = launch::Supervisor::Child{rank, -1, false, false, -1};  // could not be waited for
    ranks.stop(SIGKILL, now);
  };
  w.tick = [&] {
    if (Clock::now() < deadline || timedOut) return;
    timedOut = true;
    log::error("the health checks did not finish within {} s; stopping every rank", limit.count());
    ranks.stop(SIGKILL, now);
  };
  ranks.watch(w);
  if (timedOut) return 1;
  if (cause) {
    const int st = cause->status;
    const bool exited = st >= 0 && WIFEXITED(st);
    log::error("rank {} (pid {}) {}; stopped the other ranks", cause->rank, cause->pid,
               st < 0                                         ? "could not be waited for"
               : exited && WEXITSTATUS(st) == kRankError     ? "failed (its error is above)"
               : exited && WEXITSTATUS(st) == 2              ? "failed on bad input (above)"
                                                              : launch::describeStatus(st));
    return exited && WEXITSTATUS(st) == 2 ? 2 : 1;
  }
  int code = 0;
  for (const auto& r : ranks.children()) code = std::max(code, WEXITSTATUS(r.status));
  return code;
}

void runHealthRankAndExit(const HealthCommandOptions& o, std::ostream& out) {
  log::Options lo;
  lo.tag = fmt::format("rank {}", o.rank);
  lo.consoleLevel = log::Level::warn;
  log::init(lo);
  int code = 0;
  try {
    const JobConfig job = loadHealthJob(o);
    const int world = ranksOf(o, job);
    lo.tag = fmt::format("rank {}/{}", o.rank, world);
    log::init(lo);
    if (o.rank >= world) {
      throw UsageError(fmt::format("--rank {} is not below --procs {}", o.rank, world));
    }
    // As `cohort worker` does: each rank gets its share of the cores.
    int threads = static_cast<int>(job.distribution.threadsPerRank);
    if (threads == 0) threads = std::max(1, env::availableCores() / world);
    at::set_num_threads(threads);
    at::set_num_interop_threads(1);

    comm::CommOptions co;
    co.rank = o.rank;
    co.worldSize = world;
    co.localRank = o.rank;
    co.masterAddr = "127.0.0.1";
    co.masterPort = o.storePort;
    co.hostStore = false;
    co.backend = std::string(choiceName(job.distribution.backend));
    co.timeout = timeoutOf(job);
    co.storeToken = security::storeToken(job.security.storeTokenFile);
    co.storePrefix = "cohort-health";
    const comm::Comm comm = comm::connect(co);

    const HealthReport mine = runHealthChecks(comm, job.health, diskDirOf(job));
    const std::vector<HealthReport> all = gatherHealthReports(comm, mine);
    const std::string failures = healthFailures(all);
    // The GEMM ceiling of a rank's threads (health/ceiling.h), measured
    // again by rank 0 while the others wait, and kept when higher.
    comm::barrier(comm, "GEMM ceiling");
    std::vector<GemmCeiling> ceilings;
    if (o.rank == 0) {
      ceilings.push_back(remeasureGemmCeiling("float32", threads));
      if (bf16Kernels()) {
        // As training runs bf16 there (train/compute.h): with oneDNN held
        // to a set without bf16 kernels, LibTorch's own.
        const bool oneDnn = at::globalContext().userEnabledMkldnn();
        if (env::onednnHeldBelowBf16()) at::globalContext().setUserEnabledMkldnn(false);
        ceilings.push_back(remeasureGemmCeiling("bfloat16", threads));
        at::globalContext().setUserEnabledMkldnn(oneDnn);
      }
    }
    comm::barrier(comm, "GEMM ceiling");
    if (o.rank == 0) {
      if (o.json) {
        out << healthReportsJson(all) << "\n";
      } else {
        out << formatHealthTable(all);
        out << (failures.empty() ? fmt::format("every check passed on {} rank{}\n", world,
                                               world == 1 ? "" : "s")
                                 : std::string("FAILED (see below)\n"));
        for (const GemmCeiling& c : ceilings) out << "GEMM ceiling: " << describe(c) << "\n";
        if (!ceilings.empty()) out << "  kept in " << ceilings.front().file << "\n";
      }
      out.flush();
      if (!failures.empty()) log::error("{}", failures);
    }
    if (!failures.empty()) code = 1;
  } catch (const Error& e) {
    log::error("{}", e.what());
    code = e.exitCode() == 2 ? 2 : kRankError;
  } catch (const c10::Error& e) {
    log::error("{}", e.what_without_backtrace());
    code = kRankError;
  } catch (const std::exception& e) {
    log::error("{}", e.what());
    code = kRankError;
  }
  log::flush();
  out.flush();
  std::fflush(stdout);
  std::fflush(stderr);
  // As `cohort worker`: LibTorch's and Gloo's static destructors would race
  // their background threads for nothing.
  std::_Exit(code);
}

}  // namespace cohort::health
