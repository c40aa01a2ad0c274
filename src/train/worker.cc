#include "cohort/train/worker.h"

#include <fmt/format.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>

#include "cohort/comm/comm.h"
#include "cohort/comm/wait.h"
#include "cohort/config/load.h"
#include "cohort/core/env.h"
#include "cohort/core/fence.h"
#include "cohort/security/keys.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/run_dir.h"
#include "cohort/core/signals.h"
#include "cohort/launch/debug.h"
#include "cohort/launch/fork_server.h"
#include "cohort/monitor/progress.h"
#include "cohort/monitor/timeline.h"
#include "cohort/monitor/watchdog.h"
#include "cohort/parallel/mesh.h"
#include "cohort/train/compute.h"
#include "cohort/ckpt/resume.h"
#include "cohort/core/exit_codes.h"
#include "cohort/elastic/round_policy.h"
#include "cohort/elastic/held_state.h"
#include "cohort/ckpt/manifest.h"
#include "cohort/train/stop.h"
#include "cohort/train/trainer.h"
#include "train/detail/utilization.h"

namespace cohort::train {
namespace {

// The stop signals (core/signals.h) are blocked in every thread, from the
// process's first instruction, and taken by this thread. A SIGTERM (or
// SIGUSR2, Slurm's time-limit warning) becomes a stop request: while the
// training loop can checkpoint, it finishes the step, writes a checkpoint
// and exits 75; while the rank starts (rendezvous, data, the model), the
// request waits and training stops after its first steps the same way; with
// checkpoints off, SIGTERM ends the process at once and SIGUSR2 is only
// logged. SIGINT always ends it at once. Nothing a rank writes is left torn:
// outputs are written atomically.
//
// Under `cohort agent` (elastic), the agent speaks for its ranks: SIGUSR2
// from it asks for a re-form, the same stop at a step boundary with the
// state held in the node's memory (StopRequest::reform), and SIGTERM from it
// for a stop after a checkpoint (the whole job stops: docs/elastic.md).
// SIGTERM and SIGUSR2 from anyone else (Slurm signals every process of a
// step) are left to the agent, which gets them too.
void takeStop(StopRequest& stop, int sig) {
  const char* name = sig == SIGTERM ? "SIGTERM" : "SIGUSR2 (the time limit is near)";
  std::lock_guard<std::mutex> g(stop.mutex);
  if (stop.graceful.load()) {
    // The launcher may forward the SIGTERM its process group already
    // delivered: a repeated one changes nothing.
    if (stop.signal.exchange(sig) == 0) {
      log::warn("received {}: finishing this step, then writing a checkpoint and stopping "
                "(SIGINT stops at once)",
                name);
    }
  } else if (stop.abrupt) {
    if (sig == SIGUSR2) {
      log::warn("received {}; checkpoints are off (checkpoint.enabled): nothing to save, the "
                "rank goes on until it is ended",
                name);
      return;
    }
    log::warn("received SIGTERM, stopping (checkpoints are off)");
    log::flush();
    std::_Exit(exitCodeForSignal(sig));
  } else if (stop.signal.exchange(sig) == 0) {
    log::warn("received {} while starting: training stops after its first steps, with a "
              "checkpoint (SIGINT stops at once)",
              name);
  }
}

void installSignalThread(bool elastic) {
  const sigset_t set = rankStopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set, elastic] {
    StopRequest& stop = stopRequest();
    const pid_t agent = elastic ? ::getppid() : 0;
    for (;;) {
      siginfo_t info{};
      const int sig = sigwaitinfo(&set, &info);
      if (sig < 0) {
        if (errno == EINTR) continue;
        return;
      }
      log::setStatusLine("");
      if (elastic && sig == SIGUSR1) {
        // The round broke elsewhere: every collective fails now, and the
        // training thread holds the state of the last step (trainer.cc).
        log::warn("the agent abandons this round: ending its collectives");
        if (!stop.graceful.load()) {
          log::flush();
          std::_Exit(kExitStateHeld);
        }
        comm::abandonCollectives();
        continue;
      }
      if (elastic && (sig == SIGUSR2 || sig == SIGTERM) && info.si_pid != agent) {
        log::info("{} from pid {}: left to the agent (pid {}), which stops this node's ranks",
                  sig == SIGUSR2 ? "SIGUSR2" : "SIGTERM", info.si_pid, agent);
        continue;
      }
      if (elastic && sig == SIGUSR2) {
        stop.reform = true;
        if (!stop.graceful.load()) {
          // Not training yet: nothing to keep; the agent starts the rank again.
          log::warn("asked to re-form before training started: stopping");
          log::flush();
          std::_Exit(kExitStateHeld);
        }
        if (stop.signal.exchange(sig) == 0) {
          log::info("asked to re-form: finishing this step, then holding the state in memory");
        }
        continue;
      }
      if (sig == SIGUSR1) continue;  // not under an agent: nothing asks for it
      if (sig == SIGTERM || sig == SIGUSR2) {
        // SIGUSR2 is what `cohort submit --slurm` asks Slurm to send before
        // the time limit (docs/slurm.md).
        takeStop(stop, sig);
        continue;
      }
      log::warn("received SIGINT, stopping");
      log::flush();
      std::_Exit(exitCodeForSignal(sig));
    }
  }).detach();
}

}  // namespace

int runWorker(const WorkerOptions& o) {
  const std::optional<std::string> heldDir = env::elasticStateDir();
  env::pauseForTest("start");
  installSignalThread(heldDir.has_value());
  const env::RankEnv re = env::detectRankEnv();
  const std::string tag = fmt::format("rank {}/{}", re.rank, re.worldSize);
  log::Options lo;
  lo.tag = tag;
  lo.console = true;
  lo.consoleLevel = re.rank == 0 ? log::Level::info : log::Level::warn;
  log::init(lo);

  JobConfig job = loadJob(o.jobPath, o.overrides);
  // `cohort run` wrote job.yaml without the URLs' credentials and handed them over here.
  if (auto c = env::urlCredentials()) {
    restoreUrlCredentials(job, decodeUrlCredentials(*c, env::kUrlCredentialsVar));
  }
  // Before anything reads a checkpoint or the model: they may be sealed.
  security::installKeyring(security::loadKeyring(security::keySources(job.security.encryption)));
  if (re.worldSize != requestedWorldSize(job) && !heldDir) {
    if (re.rank == 0 && re.source != "none") {
      log::warn("the job asks for {} ranks (nodes {} x procs_per_node {}); {} started {}",
                requestedWorldSize(job), job.distribution.nodes, job.distribution.procsPerNode,
                re.source, re.worldSize);
    }
  }

  // Under `cohort agent`: the layout (elastic.gives), batch and learning
  // rate for this round's size.
  const JobConfig asWritten = job;
  if (heldDir) elastic::applyRoundPolicy(job, re.worldSize);

  // Threads, allocator and oneDNN before the first tensor (docs/performance.md).
  applyCompute(job, re.localWorldSize, re.localRank);
  const int threads = at::get_num_threads();

  comm::CommOptions co;
  static_cast<RankPlace&>(co) = re;
  co.hostStore = !re.agentStore && re.rank == 0;
  co.storeToken = security::storeToken(job.security.storeTokenFile);
  co.backend = std::string(choiceName(job.distribution.backend));
  co.interface = job.distribution.interface;
  if (co.interface.empty()) co.interface = env::nodeAddress().value_or("");
  co.glooConnections = static_cast<int>(job.distribution.glooConnections);
  co.timeout = std::chrono::milliseconds(static_cast<int64_t>(job.distribution.timeoutS * 1000));
  // --debug, --debug-on-failure: a rank held in a debugger ends nothing by
  // a timeout (launch/debug.h).
  const bool debugging = launch::debugging();
  if (debugging) co.timeout = launch::kSuspendedTimeout;
  const int restarts = env::restartCount();
  co.storePrefix = fmt::format("cohort/attempt-{}", restarts);
  if (re.worldSize > 1 && !re.masterFromEnv && re.rank == 0) {
    log::warn("MASTER_ADDR/MASTER_PORT not set: using {}:{} (set both for runs across machines)",
              re.masterAddr, re.masterPort);
  }
  launch::installDebugOnFailure(re.rank, re.worldSize, re.masterAddr);
  launch::holdForDebugger(re.rank, re.masterAddr, o.runDir);
  env::pauseForTest("rendezvous");
  comm::Comm comm = comm::connect(co);

  // Rank 0 picks the run directory and tells the others.
  std::string root = o.runDir;
  if (root.empty() && re.rank == 0) root = createDefaultRunDir(job.output.dir, job.name).root;
  root = comm::shareFromRoot(comm, "run_dir", root);
  const RunDir runDir = openRunDir(root);

  lo.file = runDir.rankLog(re.rank);
  log::init(lo);
  // Under `cohort agent`: from here on, a rank whose node the others
  // declared lost writes nothing more into the run (core/fence.h).
  if (heldDir) {
    if (const auto node = env::nodeId()) fence::install(runDir.root, *node, restarts);
  }
  const pid_t forkServer = launch::forkServerOfThisRank();
  log::info("cohort worker: {} started by {}{}, {} threads, store {}:{}", tag,
            re.agentStore ? "cohort run" : re.source,
            forkServer > 0 ? fmt::format(" (forked from its fork server, pid {})", forkServer) : "", threads,
            re.masterAddr, re.masterPort);
  if (heldDir && (asWritten.distribution.pipeline.stages > 1 || asWritten.distribution.tensor > 1)) {
    const elastic::RoundLayout l = elastic::roundLayout(asWritten, re.worldSize);
    log::info("this round's {} ranks: {} (elastic.gives {}{})", re.worldSize, l.describe(),
              choiceName(asWritten.elastic.gives),
              l.stages != asWritten.distribution.pipeline.stages
                  ? fmt::format("; the job file asks for {} stages", asWritten.distribution.pipeline.stages)
                  : std::string());
  }
  // The timeline outlives the watchdog, whose thread may flush it.
  std::unique_ptr<monitor::Timeline> timeline;
  if (job.output.timeline) {
    timeline = std::make_unique<monitor::Timeline>(
        fmt::format("{}/timeline/rank-{}.json", runDir.root, re.rank), re.rank);
  } else if (!job.output.profile.empty()) {
    // The operator profiler merges the timeline's events into its trace:
    // a timeline without a file of its own.
    timeline = std::make_unique<monitor::Timeline>(re.rank);
  }
  if (timeline) {
    timeline->nameThread(0, "training");
    timeline->nameThread(1, "checkpoint copy");
    timeline->nameThread(2, "Gloo allreduce");
    timeline->nameThread(3, "checkpoint write");
    monitor::setTimeline(timeline.get());
  }
  // The stall inspector: heartbeats from here on (see monitor/watchdog.h).
  const DistributionConfig& dc = job.distribution;
  monitor::WatchdogOptions wo;
  wo.heartbeatS = dc.heartbeatS;
  wo.warnS = dc.stallWarnS;
  wo.failS = dc.stallTimeoutS > 0 ? dc.stallTimeoutS : 0.8 * dc.timeoutS;
  if (debugging) {
    wo.failS = 0;
    if (re.rank == 0) {
      log::info("debugging: timeouts suspended (distribution.timeout_s is {} h; the stall inspector only warns)",
                launch::kSuspendedTimeout.count());
    }
  } else if (wo.failS >= dc.timeoutS) {
    throw ConfigError(fmt::format(
        "distribution.stall_timeout_s is {} s but must be below distribution.timeout_s ({} s), "
        "or Gloo's timeout ends a stalled collective first, with a less telling error",
        dc.stallTimeoutS, dc.timeoutS));
  }
  monitor::Watchdog watchdog(comm, wo);
  // What every rank must agree on before any collective of training.
  comm::checkAgreement(comm, "job (hash of the resolved job file)", jobHash(job));
  comm::checkAgreement(comm, "world (size and backend)",
                       fmt::format("{} ranks, {}", re.worldSize, choiceName(job.distribution.backend)));
  if (re.rank == 0) {
    std::error_code ec;
    if (!std::filesystem::exists(runDir.jobFile(), ec)) writeFileAtomic(runDir.jobFile(), toYaml(asWritten));
    log::info("run directory: {}", runDir.root);
  }

  TrainOptions to;
  to.restartCount = restarts;
  if (job.checkpoint.enabled || !o.resume.empty() || heldDir) {
    std::string chosen;
    if (re.rank == 0 && (job.checkpoint.enabled || !o.resume.empty())) {
      chosen = ckpt::chooseResumeCheckpoint(job, runDir, o.resume);
    }
    to.resumeFrom = comm::shareFromRoot(comm, "resume_from", chosen);
  }
  if (heldDir) {
    // The state the last round left in the nodes' memory, when it is not
    // older than the newest checkpoint on disk.
    const int64_t diskStep = to.resumeFrom.empty() ? -1 : ckpt::readManifest(to.resumeFrom).step;
    const elastic::TakenUp held = elastic::takeUpHeldState(comm, *heldDir, diskStep);
    if (!held.path.empty()) {
      to.resumeFrom = held.path;
      log::info("taking up step {} from the nodes' memory ({} bytes received by this node, "
                "{:.2f} s)",
                held.step, held.bytesReceived, held.seconds);
    }
  }
  if (restarts > 0 && heldDir) {
    log::info("round {} of this elastic job", restarts);  // `cohort agent` counts rounds there
  } else if (restarts > 0) {
    log::info("restart {} of this job", restarts);
  }

  // The named groups of the job's ranks (data, pipeline), once.
  const parallel::Mesh mesh = parallel::buildMesh(comm, meshShape(job));
  TrainSummary s = [&] {
    try {
      return train(job, mesh, runDir, to);
    } catch (const CommError& e) {
      launch::skipDebuggerOnFailure(e.what());
      throw;
    } catch (const std::exception& e) {
      // Here the process groups still stand: the other ranks wait in
      // their collective while a debugger looks (--debug-on-failure).
      launch::waitForDebuggerOnFailure(e.what());
      throw;
    }
  }();
  if (s.reformed) {
    log::flush();
    return kExitStateHeld;
  }
  if (s.stopped) {
    if (re.rank == 0) writeSummary(job, s, runDir, re.worldSize);
    log::flush();
    return kExitStoppedAfterCheckpoint;
  }
  comm::barrier(comm, "final barrier");
  if (re.rank == 0) {
    if (const auto delay = env::summaryDelayMs()) std::this_thread::sleep_for(std::chrono::milliseconds(*delay));
    writeSummary(job, s, runDir, re.worldSize);
    std::string result;
    const bool lm = tokenModel(job);
    if (s.evaluated && lm) {
      result = fmt::format("validation loss {:.4f}, perplexity {:.3f} ({} tokens)", s.lastEval.loss,
                           s.lastEval.perplexity, s.lastEval.tokens);
    } else if (s.evaluated) {
      result = fmt::format("test top-1 {:.4f}, top-5 {:.4f}, loss {:.4f} ({} images)",
                           s.lastEval.top1, s.lastEval.top5, s.lastEval.loss, s.lastEval.samples);
    } else {
      result = "no evaluation data";
    }
    log::info("done: {} epochs, {} steps in {}; {}", s.epochs, s.steps,
              monitor::formatDuration(s.seconds), result);
    if (lm) {
      log::info("throughput {:.0f} tokens/s on {} ranks (data wait {:.1f}%)",
                s.imagesPerS * double(job.model.blockSize), re.worldSize, 100 * s.dataWaitFrac);
    } else {
      log::info("throughput {:.0f} images/s on {} ranks (data wait {:.1f}%)", s.imagesPerS,
                re.worldSize, 100 * s.dataWaitFrac);
    }
    log::info("{}", detail::utilizationText(s.utilization, s.imagesPerS, re.worldSize));
    log::info("outputs in {}: {}job.yaml, metrics.jsonl, summary.json, logs/", runDir.root,
              job.output.saveFinal
                  ? (job.output.weightsFormat == WeightsFormat::safetensors ? "model/final.safetensors, "
                                                                             : "model/final.pt, ")
                  : "");
  }
  log::flush();
  return 0;
}

}  // namespace cohort::train
