#include "cohort/elastic/agent.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cohort/ckpt/held_state.h"
#include "cohort/ckpt/resume.h"
#include "cohort/comm/store.h"
#include "cohort/config/load.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/exit_codes.h"
#include "cohort/core/fence.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/net.h"
#include "cohort/core/run_dir.h"
#include "cohort/core/signals.h"
#include "cohort/core/text.h"
#include "cohort/core/time.h"
#include "cohort/elastic/round_policy.h"
#include "cohort/elastic/kv.h"
#include "cohort/elastic/rendezvous.h"
#include "cohort/run/run_metrics.h"
#include "cohort/launch/spawn.h"
#include "cohort/launch/supervisor.h"
#include "cohort/security/keys.h"
#include "elastic/detail/agent_events.h"

namespace cohort::elastic {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Child = launch::Supervisor::Child;

// The address of this machine that reaches `host` (the route's source
// address; no packet is sent).
std::string addressToward(const std::string& host) {
  if (isLoopbackAddress(host)) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) {
    throw ConfigError(fmt::format("cannot resolve {}; give this node's address with --address", host));
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in self{};
    socklen_t len = sizeof(self);
    char buf[INET_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0 &&
        inet_ntop(AF_INET, &self.sin_addr, buf, sizeof(buf)) != nullptr) {
      out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  if (out.empty()) throw ConfigError(fmt::format("no route to {}; give this node's address with --address", host));
  return out;
}

std::string defaultNodeId() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return fmt::format("{}-{}", host, ::getpid());
}

bool failedForGood(int code) { return code == 2 || code == 3 || code == 5; }

// elastic.etcd_*: the files checked here (exit 2 when one is missing or a
// secret is readable by others), read by the client on every connection.
void setEtcdCredentials(const ElasticConfig& e, KvOptions& ko) {
  for (auto [path, key] : {std::pair<const std::string*, const char*>{&e.etcdCaFile, "elastic.etcd_ca_file"},
                           {&e.etcdCertFile, "elastic.etcd_cert_file"}}) {
    std::error_code ec;
    if (!path->empty() && !std::filesystem::is_regular_file(*path, ec)) {
      throw ConfigError(fmt::format("{} {}: no such file", key, *path));
    }
  }
  if (!e.etcdKeyFile.empty()) (void)security::readSecretFile(e.etcdKeyFile, "elastic.etcd_key_file");
  ko.etcdCaFile = e.etcdCaFile;
  ko.etcdCertFile = e.etcdCertFile;
  ko.etcdKeyFile = e.etcdKeyFile;
  ko.etcdUser = e.etcdUser;
  if (!e.etcdUser.empty()) ko.etcdPassword = security::readSecretFile(e.etcdPasswordFile, "elastic.etcd_password_file");
}

// What ended a round for this node.
// fenced: the others declared this node lost (its liveness lapsed: cut
// off, or stopped) and went on without it; its ranks were killed at once.
enum class RoundEnd { completed, reform, failed, fatal, leave, interrupted, closed, stopped, fenced };

class Agent {
 public:
  Agent(const AgentOptions& o, JobConfig job, std::string jobId)
      : o_(o), job_(std::move(job)), jobId_(std::move(jobId)) {}
  int run();

 private:
  // Round after round until the job ends for this node; the exit code.
  int rounds(const std::string& prefix);
  // Whether a node of the last round other than this one is still alive.
  bool othersAlive(const std::string& prefix);
  // One round: start the ranks, watch them and the others; how it ended.
  RoundEnd runRound(const Round& r);
  void startRanks(const Round& r, const std::string& storeHostPort);
  // Sends `sig` (0: none) to the ranks still running and waits for them;
  // those left after `grace` are SIGKILLed (unless !kill: then it returns),
  // reaping all (at most `grace` + 10 s).
  void stopRanks(milliseconds grace, int sig, bool kill = true);
  // Ranks ended; their worst cause, for the log.
  void reapRanks(RoundEnd& end, bool& anyRunning);
  // Fewer than MIN nodes for too long, or the job stops: the newest held
  // state to disk.
  void persistHeldState();
  // Whether the others declared this node lost in round `r` or later (its
  // liveness lapsed): its ranks are stale, fenced out of the run.
  bool fencedOut(const Round& r);
  // This node was lost: its ranks are killed at once (they write nothing
  // more, core/fence.h), and the node rejoins.
  RoundEnd fence(const Round& r, const std::string& why);
  // Whether `sig` asks the whole job to stop with a checkpoint.
  bool asksStop(int sig) const { return sig == SIGUSR2 || (sig == SIGTERM && o_.termStopsJob); }
  // Notes a signal taken: a stop asked, or SIGINT/SIGTERM kept in
  // pendingSignal_.
  void noteSignal(int sig);
  // Takes the signals that arrived, without waiting.
  void takeSignals();
  // The job stopped (asksStop): the record is closed for every node; exit
  // 75. `held`: the ranks held their state rather than checkpointing it (a
  // re-form was under way, or checkpoints are off), so the newest held
  // state goes to disk first.
  int stopJob(bool held);

  const AgentOptions& o_;
  const JobConfig job_;
  const std::string jobId_;
  std::unique_ptr<Kv> kv_;
  std::unique_ptr<Rendezvous> rdzv_;
  std::unique_ptr<BlockedSignals> signals_;
  std::unique_ptr<launch::Supervisor> ranks_;
  std::unique_ptr<detail::AgentEvents> events_;
  RunDir runDir_;
  std::string nodeId_, address_, stateDir_, storeToken_, exe_;
  int procs_ = 1;
  std::vector<std::pair<std::string, std::string>> debugVars_;  // launch/debug.h
  int failures_ = 0;
  bool leaving_ = false;
  bool reformAsked_ = false;
  bool stopAsked_ = false;  // SIGUSR2 (or SIGTERM with termStopsJob) came
  int fatalCode_ = 1;
  int pendingSignal_ = 0;  // SIGINT or SIGTERM taken while joining or stopping ranks
  std::vector<std::string> lastMembers_;
  std::string cause_;
  Clock::time_point lostAt_{};  // when the last loss was seen (for the figures)
};

int Agent::run() {
  env::pauseForTest("agent");
  procs_ = static_cast<int>(o_.procs > 0 ? o_.procs : job_.distribution.procsPerNode);
  checkRoundPolicy(job_, o_.minNodes, o_.maxNodes);
  debugVars_ = launch::debugEnvironment(o_.debug, o_.maxNodes * procs_);
  const std::string service = splitRdzvUrl(o_.rdzv).first;
  storeToken_ = security::storeToken(job_.security.storeTokenFile);
  KvOptions ko;
  ko.retryFor = milliseconds(static_cast<int64_t>(job_.elastic.rdzvTimeoutS * 1000));
  ko.aliveTtl = milliseconds(static_cast<int64_t>(job_.elastic.nodeTimeoutS * 1000));
  ko.storeToken = storeToken_;
  setEtcdCredentials(job_.elastic, ko);
  const std::string rdzvHost = [&] {
    const std::string rest = service.substr(service.find("://") + 3);
    const std::string first = rest.substr(0, rest.find(','));
    return first.substr(0, first.rfind(':'));
  }();
  address_ = o_.address.empty() ? addressToward(rdzvHost) : o_.address;
  if (!isLoopbackAddress(address_) && storeToken_.empty()) {
    throw ConfigError(
        "cohort agent on several machines needs a store token on every node "
        "(security.store_token_file or COHORT_STORE_TOKEN): the ranks' store listens on " +
        address_);
  }
  // On loopback without a token, the stores ask for none (docs/security.md).
  nodeId_ = o_.nodeId.empty() ? defaultNodeId() : o_.nodeId;
  exe_ = o_.executable.empty() ? launch::selfExecutable() : o_.executable;
  runDir_ = openRunDir(o_.runDir.empty() ? job_.output.dir + "/" + job_.name + "-" + jobId_ : o_.runDir);
  writeFileAtomic(runDir_.jobFile(), toYaml(job_));
  log::Options lo;
  lo.tag = "agent " + nodeId_;
  lo.file = fmt::format("{}/logs/agent-{}.log", runDir_.root, nodeId_);
  log::init(lo);
  stateDir_ = fmt::format("{}/cohort-{}-{}", job_.elastic.stateDir, jobId_, nodeId_);
  events_ = std::make_unique<detail::AgentEvents>(runDir_, nodeId_);
  // output.metrics_port: this node's elastic counts for Prometheus.
  std::unique_ptr<monitor::MetricsServer> metrics;
  if (job_.output.metricsPort > 0) {
    metrics = std::make_unique<monitor::MetricsServer>(run::metricsServerConfig(job_.output),
                                                       [this] { return events_->render(); });
    metrics->start();
    log::info("Prometheus metrics of this node at {}/metrics", metrics->address());
  }

  signals_ = std::make_unique<BlockedSignals>(std::initializer_list<int>{SIGCHLD, SIGINT, SIGTERM, SIGUSR2});
  kv_ = connectKv(service, ko);
  RendezvousOptions ro;
  ro.prefix = "/cohort/" + jobId_;
  ro.jobId = jobId_;
  ro.nodeId = nodeId_;
  ro.address = address_;
  ro.jobHash = jobHash(job_);
  ro.minNodes = o_.minNodes;
  ro.maxNodes = o_.maxNodes;
  ro.lastCall = milliseconds(static_cast<int64_t>(job_.elastic.lastCallS * 1000));
  ro.belowMinFor = milliseconds(static_cast<int64_t>(job_.elastic.belowMinTimeoutS * 1000));
  ro.interrupted = [this] {
    takeSignals();
    return pendingSignal_ != 0 || stopAsked_;
  };
  // A node the others lose is fenced out of the run: its ranks, should they
  // run on (a partition heals, a stopped machine resumes), write nothing
  // more into it.
  ro.lost = [this](const std::vector<std::string>& nodes, int64_t round) {
    for (const std::string& n : nodes) {
      if (fence::lostIn(runDir_.root, n) >= round) continue;
      fence::markLost(runDir_.root, n, round);
      if (n != nodeId_) log::info("node {} fenced out of the run (lost in round {})", n, round);
    }
  };
  rdzv_ = std::make_unique<Rendezvous>(*kv_, ro);
  log::info("node {} at {} joining job '{}' on {} ({}..{} nodes of {} ranks); run directory {}",
            nodeId_, address_, jobId_, kv_->describe(), o_.minNodes, o_.maxNodes, procs_,
            runDir_.root);
  kv_->keepAlive(aliveKey(ro.prefix, nodeId_), address_);

  // However this node ends, its state is of no more use after it (below
  // MIN, it went to the checkpoint directory first).
  struct RemoveState {
    const std::string& dir;
    ~RemoveState() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } removeState{stateDir_};
  const int code = rounds(ro.prefix);
  if (kv_->hosting()) {
    // The others read the record's last state from this process: give them
    // the time to see it before the store goes.
    const auto until = Clock::now() + ko.aliveTtl;
    while (Clock::now() < until && othersAlive(ro.prefix)) std::this_thread::sleep_for(milliseconds(100));
  }
  return code;
}

bool Agent::othersAlive(const std::string& prefix) {
  for (const auto& m : lastMembers_) {
    if (m != nodeId_ && kv_->alive(aliveKey(prefix, m))) return true;
  }
  return false;
}

int Agent::rounds(const std::string& prefix) {
  for (;;) {
    const auto joinStart = Clock::now();
    const Round r = rdzv_->join();
    if (!r.members.empty()) lastMembers_ = r.members;
    if (r.status == Round::Status::interrupted && pendingSignal_ == 0) return stopJob(true);
    if (r.status == Round::Status::interrupted) {
      kv_->release();
      log::info("received {} while waiting to join: node {} leaves", pendingSignal_ == SIGTERM ? "SIGTERM" : "SIGINT", nodeId_);
      return pendingSignal_ == SIGTERM ? 0 : exitCodeForSignal(SIGINT);
    }
    if (r.status == Round::Status::closed) {
      log::info("job '{}' has ended (exit code {}): nothing to join", jobId_, r.exitCode);
      kv_->release();
      return r.exitCode;
    }
    if (r.status == Round::Status::belowMin) {
      log::error("fewer than {} nodes for {} s (elastic.below_min_timeout_s): writing the newest "
                 "state to the checkpoint directory and stopping; rerun the agents to resume",
                 o_.minNodes, job_.elastic.belowMinTimeoutS);
      events_->add({{"event", "below_min"}, {"nodes", r.members.size()}});
      persistHeldState();
      kv_->release();
      return kExitStoppedAfterCheckpoint;
    }
    std::filesystem::create_directories(stateDir_);
    events_->add({{"event", "round"},
                  {"round", r.round},
                  {"nodes", r.members.size()},
                  {"node_rank", r.nodeRank},
                  {"rendezvous_s", secondsSince(joinStart)}});
    log::info("round {}: node {} of {} [{}]; {} ranks; rendezvous took {:.2f} s", r.round, r.nodeRank,
              r.members.size(), fmt::join(r.members, ", "), r.members.size() * procs_,
              secondsSince(joinStart));
    RoundEnd end = runRound(r);
    // A rank that failed (or found itself fenced) in a round the others
    // had gone on from was a consequence of this node's loss, not a
    // failure of its own.
    if ((end == RoundEnd::failed || end == RoundEnd::reform) && fencedOut(r)) end = fence(r, cause_);
    // A stop asked while the ranks stopped for a re-form (or failed): their
    // state is held, not checkpointed.
    takeSignals();
    if (stopAsked_ && (end == RoundEnd::reform || end == RoundEnd::failed || end == RoundEnd::leave)) {
      return stopJob(true);
    }
    switch (end) {
      case RoundEnd::completed:
        rdzv_->close(0);
        events_->add({{"event", "completed"}, {"round", r.round}});
        if (r.nodeRank == 0) events_->writeSummary();
        kv_->release();
        log::info("job '{}' completed", jobId_);
        return 0;
      case RoundEnd::closed:
        // Another node saw its ranks finish first and closed the job: when
        // it completed, node 0 still writes the job's elastic summary.
        if (fatalCode_ == 0) {
          events_->add({{"event", "completed"}, {"round", r.round}});
          if (r.nodeRank == 0) events_->writeSummary();
        }
        kv_->release();
        log::info("job '{}' ended elsewhere (exit code {})", jobId_, fatalCode_);
        return fatalCode_;
      case RoundEnd::stopped:
        // The ranks wrote a checkpoint and stopped: the whole job stops.
        return stopJob(false);
      case RoundEnd::fatal:
        rdzv_->close(fatalCode_);
        kv_->release();
        log::error("{}; the job ends (exit code {})", cause_, fatalCode_);
        return fatalCode_;
      case RoundEnd::interrupted:
        kv_->release();
        rdzv_->openNext(r, nodeId_ + " was interrupted");
        return exitCodeForSignal(SIGINT);
      case RoundEnd::leave:
        kv_->release();
        rdzv_->openNext(r, nodeId_ + " leaves");
        events_->add({{"event", "leave"}, {"round", r.round}});
        log::info("node {} left the job after SIGTERM; the others go on without it", nodeId_);
        return 0;
      case RoundEnd::failed:
        ++failures_;
        events_->add({{"event", "failure"}, {"round", r.round}, {"cause", cause_}});
        if (failures_ > job_.distribution.maxRestarts) {
          log::error("{}; giving up after {} failures (distribution.max_restarts)", cause_,
                     failures_ - 1);
          rdzv_->close(1);
          kv_->release();
          return 1;
        }
        log::warn("{}; re-forming (failure {} of at most {})", cause_, failures_,
                  job_.distribution.maxRestarts);
        rdzv_->openNext(r, cause_);
        break;
      case RoundEnd::reform:
        events_->add({{"event", "reform"}, {"round", r.round}, {"cause", cause_}});
        rdzv_->openNext(r, cause_);
        break;
      case RoundEnd::fenced:
        events_->add({{"event", "fenced"}, {"round", r.round}, {"cause", cause_}});
        rdzv_->openNext(r, cause_);
        break;
    }
    // Our own liveness may have lapsed (a cut link): renew it before joining.
    if (!kv_->alive(aliveKey(prefix, nodeId_))) kv_->keepAlive(aliveKey(prefix, nodeId_), address_);
  }
}

void Agent::startRanks(const Round& r, const std::string& storeHostPort) {
  const size_t colon = storeHostPort.rfind(':');
  const UrlCredentials credentials = [&] {
    JobConfig copy = job_;
    return takeUrlCredentials(copy);
  }();
  ranks_ = std::make_unique<launch::Supervisor>();
  const int world = static_cast<int>(r.members.size()) * procs_;
  for (int local = 0; local < procs_; ++local) {
    env::RankEnv re;
    re.rank = r.nodeRank * procs_ + local;
    re.worldSize = world;
    re.localRank = local;
    re.localWorldSize = procs_;
    re.masterAddr = storeHostPort.substr(0, colon);
    re.masterPort = std::stoi(storeHostPort.substr(colon + 1));
    re.agentStore = true;
    std::vector<std::pair<std::string, std::string>> extra = {
        {env::kElasticStateVar, stateDir_},
        {env::kNodeAddressVar, address_},
        {env::kNodeIdVar, nodeId_},
        // Ranks of one node share memory; nodes never do, even on one host.
        {"COHORT_MACHINE_ID", nodeId_},
    };
    extra.insert(extra.end(), debugVars_.begin(), debugVars_.end());
    // job.yaml holds the job as resolved, overrides included.
    const std::vector<std::string> args = {exe_, "worker", runDir_.jobFile(), "--run-dir", runDir_.root};
    const auto envBlock =
        launch::rankEnvironment(re, static_cast<int>(r.round), credentials, storeToken_, extra);
    const sigset_t mask = withRankStopSignals(signals_->original());
    ranks_->start(re.rank, exe_, args, &envBlock, &mask, "the worker binary");
  }
}

void Agent::stopRanks(milliseconds grace, int sig, bool kill) {
  if (!ranks_) return;
  ranks_->stop(sig, grace, kill);
  launch::Supervisor::Watch w;
  w.wait = [this](milliseconds poll) { noteSignal(signals_->wait(poll)); };
  ranks_->watch(w);
}

RoundEnd Agent::runRound(const Round& r) {
  // Node 0 hosts the round's store for the ranks (a fresh one each round).
  std::unique_ptr<comm::StoreServer> store;
  std::string storeAt;
  if (r.nodeRank == 0) {
    comm::StoreServerOptions so;
    so.addr = address_;
    so.port = 0;
    so.token = storeToken_;
    store = std::make_unique<comm::StoreServer>(so);
    storeAt = fmt::format("{}:{}", address_, store->port());
    rdzv_->publishStore(r.round, storeAt);
  } else {
    const auto at = rdzv_->waitStore(r, milliseconds(static_cast<int64_t>(job_.distribution.timeoutS * 1000)));
    if (!at) {
      cause_ = fmt::format("round {}: node 0 never published its store", r.round);
      return RoundEnd::reform;
    }
    storeAt = *at;
  }
  reformAsked_ = false;
  startRanks(r, storeAt);
  const auto stopGrace = milliseconds(static_cast<int64_t>(job_.distribution.stopTimeoutS * 1000));
  auto nextCheck = Clock::now();
  for (;;) {
    RoundEnd end = RoundEnd::completed;
    bool anyRunning = false;
    reapRanks(end, anyRunning);
    if (!anyRunning) {
      if (end == RoundEnd::reform && leaving_) return RoundEnd::leave;
      return end;
    }
    if (end == RoundEnd::fatal) {
      stopRanks(milliseconds(2000), SIGKILL);
      return end;
    }
    if (end == RoundEnd::failed) {
      // One rank failed: the others hold the state of their last step and
      // stop (a broken collective is abandoned at once).
      stopRanks(stopGrace, SIGUSR1);
      return end;
    }
    const int sig = signals_->wait(milliseconds(50));
    if (sig == SIGINT) {
      stopRanks(milliseconds(2000), SIGKILL);
      return RoundEnd::interrupted;
    }
    if (asksStop(sig)) {
      if (!stopAsked_) {
        // SIGTERM from the agent: the ranks stop at the next step boundary,
        // every rank of the job, after a checkpoint (without checkpoints,
        // holding the state, which then goes to disk).
        log::warn("received {}: the job stops after this step, with a checkpoint",
                  sig == SIGUSR2 ? "SIGUSR2 (the time limit is near, or a preemption)" : "SIGTERM");
        if (!reformAsked_) ranks_->signalAll(job_.checkpoint.enabled ? SIGTERM : SIGUSR2);
        reformAsked_ = true;
        cause_ = "the job stops";
      }
      stopAsked_ = true;
    } else if (sig == SIGTERM && !leaving_) {
      leaving_ = true;
      log::warn("received SIGTERM: this node's ranks finish their step and the node leaves");
      ranks_->signalAll(SIGUSR2);
      reformAsked_ = true;
      cause_ = nodeId_ + " leaves";
    }
    if (Clock::now() < nextCheck) continue;
    nextCheck = Clock::now() + milliseconds(200);
    const Change c = rdzv_->check(r);
    if (c.kind == Change::Kind::waiting && !reformAsked_) {
      log::info("node(s) {} wait to join: re-forming at the next step boundary", c.detail);
      ranks_->signalAll(SIGUSR2);
      reformAsked_ = true;
      cause_ = "admitting " + c.detail;
    } else if ((c.kind == Change::Kind::lost || c.kind == Change::Kind::reformed) && fencedOut(r)) {
      return fence(r, c.kind == Change::Kind::lost ? "its liveness lapsed" : "another node re-formed without it (" + c.detail + ")");
    } else if (c.kind == Change::Kind::lost) {
      lostAt_ = Clock::now();
      cause_ = fmt::format("node(s) {} lost (no liveness for elastic.node_timeout_s)", c.detail);
      log::warn("{}: this node's ranks hold the state of their last step and stop", cause_);
      stopRanks(stopGrace, SIGUSR1);
      return RoundEnd::reform;
    } else if (c.kind == Change::Kind::reformed && !reformAsked_) {
      // Another node re-forms: its ranks stop at the next step boundary,
      // and ours with them (the stop is agreed); a broken round is ended.
      cause_ = "another node re-forms (" + c.detail + ")";
      ranks_->signalAll(SIGUSR2);
      reformAsked_ = true;
      // Healthy ranks stop at the agreed step boundary within moments; ranks
      // stuck in a broken collective are told to abandon it.
      stopRanks(milliseconds(3000), 0, /*kill=*/false);
      stopRanks(stopGrace, SIGUSR1);
      return RoundEnd::reform;
    } else if (c.kind == Change::Kind::closed) {
      // The job ended elsewhere (completed or failed): ours finish as well.
      stopRanks(stopGrace, 0);
      fatalCode_ = std::stoi(c.detail);
      return RoundEnd::closed;
    }
  }
}

void Agent::reapRanks(RoundEnd& end, bool& anyRunning) {
  ranks_->reap([&](const Child& c) {
    const int code = WIFEXITED(c.status) ? WEXITSTATUS(c.status) : -1;
    if (code == 0) return;
    if (code == kExitStoppedAfterCheckpoint) {
      // Stopped after a checkpoint, as every rank of the round does.
      if (end == RoundEnd::completed || end == RoundEnd::reform) end = RoundEnd::stopped;
      return;
    }
    if (code == kExitFenced) {
      // It found this node declared lost before the agent did.
      if (end == RoundEnd::completed) end = RoundEnd::reform;
      if (cause_.empty()) cause_ = "a rank found this node fenced";
      return;
    }
    if (code == kExitStateHeld) {
      if (end == RoundEnd::completed) end = RoundEnd::reform;
      if (cause_.empty()) cause_ = "a rank stopped for a re-form";
      return;
    }
    const std::string what = fmt::format("rank {} (pid {}) {}", c.rank, c.pid, launch::describeStatus(c.status));
    if (failedForGood(code)) {
      end = RoundEnd::fatal;
      fatalCode_ = code == 2 ? 2 : 1;
      cause_ = what;
    } else if (end != RoundEnd::fatal) {
      end = RoundEnd::failed;
      cause_ = what;
    }
    log::warn("{}. Its log: {}", what, runDir_.rankLog(c.rank));
  });
  anyRunning = ranks_->anyRunning();
}

bool Agent::fencedOut(const Round& r) {
  return fence::lostIn(runDir_.root, nodeId_) >= r.round ||
         !kv_->alive(aliveKey(rdzv_->options().prefix, nodeId_));
}

RoundEnd Agent::fence(const Round& r, const std::string& why) {
  cause_ = fmt::format("node {} was declared lost in round {} ({}): the others went on without it", nodeId_,
                       r.round, why);
  log::warn("{}; its ranks are stopped at once and write nothing more into the run (fenced); the node "
            "rejoins the job",
            cause_);
  // Marked here too, in case this node learns of its loss first: its ranks
  // are fenced before the signal reaches them.
  fence::markLost(runDir_.root, nodeId_, r.round);
  stopRanks(milliseconds(0), SIGKILL);
  return RoundEnd::fenced;
}

void Agent::noteSignal(int sig) {
  if (asksStop(sig)) {
    stopAsked_ = true;
  } else if (sig == SIGINT || sig == SIGTERM) {
    pendingSignal_ = sig;
  }
}

void Agent::takeSignals() {
  for (int sig; (sig = signals_->wait(milliseconds(0))) != 0;) noteSignal(sig);
}

int Agent::stopJob(bool held) {
  log::warn("the job stopped{}; rerun (or requeue) it to resume",
            held ? ": the newest state held goes to the checkpoint directory" : " after a checkpoint");
  events_->add({{"event", "stopped"}});
  if (held) persistHeldState();
  rdzv_->close(kExitStoppedAfterCheckpoint);
  kv_->release();
  return kExitStoppedAfterCheckpoint;
}

void Agent::persistHeldState() {
  const std::vector<ckpt::HeldStep> held = ckpt::listHeldState(stateDir_);
  for (const ckpt::HeldStep& h : held) {
    if (!ckpt::missingFiles(h.manifest).empty()) continue;
    const std::string target = ckpt::checkpointDir(job_, runDir_) + "/" + ckpt::checkpointDirName(h.manifest.step);
    if (ckpt::verifyCheckpoint(target, false).valid) return;  // already there
    std::filesystem::create_directories(target);
    for (const auto& f : h.manifest.files) {
      std::filesystem::copy_file(h.path + "/" + f.name, target + "/" + f.name,
                                 std::filesystem::copy_options::overwrite_existing);
    }
    ckpt::writeManifest(target, h.manifest);
    log::info("wrote the held state of step {} to {}", h.manifest.step, target);
    return;
  }
  log::warn("this node holds no whole state in memory; the newest checkpoint on disk is where a "
            "rerun resumes");
}

}  // namespace

std::pair<std::string, std::string> splitRdzvUrl(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t slash = scheme == std::string::npos ? std::string::npos : url.find('/', scheme + 3);
  const std::string id = slash == std::string::npos ? "" : url.substr(slash + 1);
  if (!isPortableName(id)) {
    throw ConfigError(fmt::format(
        "--rdzv {}: expected etcd://HOST:PORT[,HOST:PORT...]/JOB_ID, etcds://... or store://HOST:PORT/JOB_ID, "
        "with a job id of letters, digits, '.', '_' and '-'",
        url));
  }
  return {url.substr(0, slash), id};
}

int runAgent(const AgentOptions& o) {
  log::Options lo;
  lo.tag = "agent";
  log::init(lo);
  if (o.minNodes < 1 || o.maxNodes < o.minNodes) {
    throw UsageError(fmt::format("--nnodes {}:{}: MIN must be at least 1 and at most MAX",
                                 o.minNodes, o.maxNodes));
  }
  if (o.procs < 0) throw UsageError(fmt::format("--procs must be >= 1, got {}", o.procs));
  const std::string jobId = splitRdzvUrl(o.rdzv).second;
  // Node ids name files in the run directory (logs, events, the fence).
  if (!o.nodeId.empty() && !isPortableName(o.nodeId)) {
    throw UsageError(fmt::format("--node-id '{}': a node id is made of letters, digits, '.', '_' and "
                                 "'-' (at most 128)",
                                 o.nodeId));
  }
  JobConfig job = loadJob(o.jobPath, o.overrides);
  if (o.procs > 0) job.distribution.procsPerNode = o.procs;
  // A missing key fails here, before joining.
  security::loadKeyring(security::keySources(job.security.encryption));
  Agent agent(o, std::move(job), jobId);
  return agent.run();
}

}  // namespace cohort::elastic
