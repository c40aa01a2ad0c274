// Faults between machines (util/netfault.h) on test hosts in network
// namespaces: loss, a bandwidth limit and added latency on every link, a
// node partitioned for longer than elastic.node_timeout_s and then healed,
// and a node stopped with SIGSTOP and resumed. Each checks the final state:
// the same weights as on a clean network, or every sample trained on
// exactly once, and that a node the others declared lost writes nothing
// more into the run (core/fence.h).
// Needs root; skips with the reason otherwise (fails under
// COHORT_TEST_NO_SKIP=1).

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <iostream>
#include <thread>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/core/fence.h"
#include "elastic/elastic_util.h"
#include "util/etcd.h"
#include "util/jobs.h"
#include "util/netfault.h"
#include "util/netns.h"
#include "util/process.h"
#include "util/runs.h"
#include "util/skip.h"

namespace cohort::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const char* kToken = "netfault-test-token-0123456789abcdef";

// Every fault of the first kind at once, on every host: 1% loss each way of
// each link, 50 Mbit/s, 5 ms more each way of every TCP connection.
void degrade(LinkFaults& faults, int hosts) {
  for (int h = 0; h < hosts; ++h) {
    faults.latency(h, 5);
    faults.loss(h, 1);
    faults.rate(h, "50mbit");
  }
}

// When each file under a directory first appeared, polled every 25 ms by a
// thread of its own: what a stale writer put into the run, even when a
// later retention removed it again.
class FileWatch {
 public:
  using Clock = std::chrono::steady_clock;
  explicit FileWatch(std::string dir) : dir_(std::move(dir)), thread_([this] { loop(); }) {}
  ~FileWatch() {
    stop_ = true;
    thread_.join();
  }
  // The files (relative paths) below `sub` that first appeared after `t`.
  std::vector<std::string> appearedAfter(const std::string& sub, Clock::time_point t) {
    std::lock_guard<std::mutex> g(mutex_);
    std::vector<std::string> out;
    for (const auto& [path, when] : seen_) {
      if (path.rfind(sub, 0) == 0 && when > t) out.push_back(path);
    }
    return out;
  }

 private:
  void loop() {
    while (!stop_) {
      std::error_code ec;
      for (fs::recursive_directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string rel = fs::relative(it->path(), dir_, ec).string();
        std::lock_guard<std::mutex> g(mutex_);
        seen_.emplace(rel, Clock::now());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  std::string dir_;
  std::mutex mutex_;
  std::map<std::string, Clock::time_point> seen_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class NetFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = TestNetwork::unavailable(); !why.empty()) COHORT_SKIP(why);
    if (etcdBinary().empty()) COHORT_SKIP("etcd is not installed (scripts/install-deps.sh)");
    if (::access("/usr/sbin/nft", X_OK) != 0) COHORT_SKIP("nftables is not installed (scripts/install-deps.sh)");
  }

  // A directory of its own for one run: job, samples, state, runs; `sets`:
  // key=value overrides its agents get.
  struct Run {
    std::string dir, job, samples, runDir;
    std::vector<std::string> sets;
  };
  Run makeRun(const std::string& tag, int epochs, const std::vector<std::string>& sets = {}) {
    Run r;
    r.sets = sets;
    r.dir = dir_.file(tag);
    r.samples = r.dir + "/samples";
    r.runDir = r.dir + "/run";
    r.job = r.dir + "/job.yaml";
    fs::create_directories(r.samples);
    fs::create_directories(r.dir + "/shm");
    writeText(r.job, elasticJobYaml(r.dir + "/runs", epochs, "  state_dir: " + r.dir + "/shm\n"));
    return r;
  }

  std::map<std::string, std::string> env(const Run& r, int slowMs = 0) const {
    auto e = elasticEnv(r.samples, slowMs);
    e["COHORT_STORE_TOKEN"] = kToken;
    return e;
  }

  // A static job: one `cohort worker` per host with torchrun's
  // environment, rank 0 hosting the store on host 0. Waits for them; true
  // when both exit 0.
  bool runStatic(const TestNetwork& net, const Run& r) {
    const std::string port = "29511";
    std::vector<std::unique_ptr<Process>> ranks;
    for (int h = 0; h < 2; ++h) {
      std::vector<std::string> argv = net.on(h);
      argv.insert(argv.end(), {cohortBin(), "worker", r.job, "--run-dir", r.runDir});
      auto e = env(r);
      e["RANK"] = std::to_string(h);
      e["WORLD_SIZE"] = "2";
      e["MASTER_ADDR"] = net.address(0);
      e["MASTER_PORT"] = port;
      e["COHORT_MACHINE_ID"] = fmt::format("host-{}", h);
      ranks.push_back(std::make_unique<Process>(argv, e));
      if (h == 0) {
        // Rank 1 connects through the relay, which can only reset a
        // connection to a port not yet listening, not refuse it.
        const bool listening = waitUntil([&] {
          std::vector<std::string> ss = net.on(0);
          ss.insert(ss.end(), {"/usr/bin/ss", "-Hltn", "sport = :" + port});
          return !run(ss, {}, 10s).out.empty();
        }, 60s);
        if (!listening) {
          ADD_FAILURE() << "rank 0's store never listened: " << ranks[0]->stderrSoFar();
          return false;
        }
      }
    }
    return expectAllExitZero(ranks, 5min);
  }

  // An agent on `host`; its rank 0 (if it has it) `slowMs` slower a step.
  std::unique_ptr<Process> agentOn(const TestNetwork& net, int host, const Run& r, const std::string& rdzv,
                                   const std::string& nnodes, std::map<std::string, std::string> e = {},
                                   int slowMs = 8) {
    auto vars = env(r, slowMs);
    for (auto& [k, v] : e) vars[k] = v;
    AgentSpec s{fmt::format("host-{}", host), rdzv, nnodes, r.job, r.runDir, net.on(host), {}};
    for (const auto& kv : r.sets) s.extraArgs.insert(s.extraArgs.end(), {"--set", kv});
    return startAgent(s, vars);
  }

  // Runs an elastic job of `hosts` agents to the end; true when all exit 0.
  bool runElastic(const TestNetwork& net, int hosts, const Run& r, const std::string& rdzv) {
    std::vector<std::unique_ptr<Process>> agents;
    for (int h = 0; h < hosts; ++h) agents.push_back(agentOn(net, h, r, rdzv, "2:3"));
    return expectAllExitZero(agents, 5min);
  }

  static int64_t steps(const Run& r) { return readSampleLog(r.samples).lastStep; }
  static int lastRound(const Run& r) {
    const SampleHistory h = readSampleLog(r.samples);
    return h.stepsByRound.empty() ? -1 : h.stepsByRound.rbegin()->first;
  }
  static std::string tail(Process& p) {
    const std::string e = p.stderrSoFar();
    return e.substr(e.size() > 4000 ? e.size() - 4000 : 0);
  }
  static std::string rankLogs(const Run& r) {
    std::string all;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(r.runDir + "/logs", ec)) all += readText(f.path().string());
    return all;
  }

  TempDir dir_;
};

TEST_F(NetFaultTest, LossRateAndLatencyLeaveTheWeightsBitwiseTheSame) {
  TestNetwork net(2);
  EtcdCluster etcd(1, net.bridgeAddress());
  // Clean, then degraded; a static job and an elastic one (its epoch's
  // tail is split otherwise, so the two differ from each other).
  const Run cleanStatic = makeRun("clean-static", 1), cleanElastic = makeRun("clean-elastic", 1);
  auto timed = [](const std::function<bool()>& f, double& seconds) {
    const auto start = std::chrono::steady_clock::now();
    const bool ok = f();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return ok;
  };
  double cleanS = 0, badS = 0;
  ASSERT_TRUE(timed([&] { return runStatic(net, cleanStatic); }, cleanS));
  ASSERT_TRUE(runElastic(net, 2, cleanElastic, "etcd://" + etcd.endpoints() + "/clean"));
  LinkFaults faults(net);
  degrade(faults, 2);
  std::cout << "host 0: " << faults.describe(0) << "\n";
  const Run badStatic = makeRun("faulty-static", 1), badElastic = makeRun("faulty-elastic", 1);
  ASSERT_TRUE(timed([&] { return runStatic(net, badStatic); }, badS));
  ASSERT_TRUE(runElastic(net, 2, badElastic, "etcd://" + etcd.endpoints() + "/faulty"));
  std::cout << fmt::format("static job: {:.1f} s clean, {:.1f} s degraded\n", cleanS, badS);
  RecordProperty("static_clean_seconds", std::to_string(cleanS));
  RecordProperty("static_degraded_seconds", std::to_string(badS));
  // The faults were there: packets dropped, connections relayed.
  for (int h = 0; h < 2; ++h) {
    EXPECT_GT(faults.dropped(h), 0) << "host " << h;
    EXPECT_GT(faults.relayed(h), 0) << "host " << h;
    std::cout << fmt::format("host {}: {} packets dropped, {} connections relayed\n", h, faults.dropped(h),
                             faults.relayed(h));
  }
  for (const auto& [clean, bad] : {std::pair{cleanStatic, badStatic}, {cleanElastic, badElastic}}) {
    const ckpt::StateDict a = ckpt::readStateDict(clean.runDir + "/model/final.pt");
    const ckpt::StateDict b = ckpt::readStateDict(bad.runDir + "/model/final.pt");
    EXPECT_EQ(maxDifference(a, b), 0.0) << bad.runDir << " differs from " << clean.runDir;
  }
  expectExactlyOnce(badElastic.samples, 1);
  // One round from start to end: the faults broke no connection.
  EXPECT_EQ(readSampleLog(badElastic.samples).stepsByRound.size(), 1u);
}

TEST_F(NetFaultTest, APartitionedNodeIsFencedAndRejoinsAtAStepBoundary) {
  // Host 0 is node 0: it hosts the round's store, and its rank 0 commits
  // checkpoints. Its writer is held in step 100 for 10 s; the partition
  // begins just after and lasts 16 s, so the writer resumes while the
  // others, having declared host 0 lost, go on without it: the fence must
  // stop it.
  TestNetwork net(3);
  EtcdCluster etcd(1, net.bridgeAddress());
  // 5 epochs at about 30 steps a second: the job outlasts the partition.
  // Every checkpoint is kept, so that what was written stays to be seen.
  const Run r = makeRun("partition", 5, {"checkpoint.keep_last=100"});
  const std::string rdzv = "etcd://" + etcd.endpoints() + "/partition";
  LinkFaults faults(net);
  std::vector<std::unique_ptr<Process>> agents;
  agents.push_back(agentOn(net, 0, r, rdzv, "2:3", {{"COHORT_TEST_CKPT_PAUSE", "100:10"}}, 25));
  for (int h = 1; h < 3; ++h) agents.push_back(agentOn(net, h, r, rdzv, "2:3", {}, 25));
  FileWatch watch(r.runDir);
  ASSERT_TRUE(waitUntil([&] { return steps(r) > 102; }, 120s)) << tail(*agents[0]);
  const int roundAtCut = lastRound(r);
  faults.partition(0);
  const auto cutAt = std::chrono::steady_clock::now();
  // The others declare host 0 lost, re-form without it and train on while
  // it is cut off.
  ASSERT_TRUE(waitUntil([&] { return fence::lostIn(r.runDir, "host-0") >= roundAtCut; }, 30s)) << tail(*agents[1]);
  const auto fencedAt = std::chrono::steady_clock::now();
  ASSERT_TRUE(waitUntil([&] { return lastRound(r) > roundAtCut && steps(r) > 130; }, 60s)) << tail(*agents[1]);
  std::this_thread::sleep_until(cutAt + 16s);
  faults.heal(0);
  // Healed, host 0 learns it was declared lost, kills its stale ranks and
  // rejoins: a later round with three nodes.
  const int roundAtHeal = lastRound(r);
  ASSERT_TRUE(waitUntil([&] { return agents[0]->stderrSoFar().find("was declared lost") != std::string::npos; },
                        90s))
      << tail(*agents[0]);
  expectAllExitZero(agents, 4min);
  expectExactlyOnce(r.samples, 5);
  const SampleHistory h = readSampleLog(r.samples);
  EXPECT_GT(h.stepsByRound.rbegin()->first, roundAtHeal) << "host 0 never rejoined";
  // The stale writer met the fence: nothing of step 100 (the others never
  // write it again) came into the run once host 0 was declared lost.
  const std::string logs = rankLogs(r);
  EXPECT_NE(logs.find("fenced: the other nodes declared this node lost"), std::string::npos);
  const auto late = watch.appearedAfter("checkpoints/step-100/", fencedAt);
  EXPECT_TRUE(late.empty()) << "the stale writer wrote " << fmt::format("{}", fmt::join(late, ", "));
  for (const auto& d : ckpt::listCheckpointDirs(r.runDir + "/checkpoints")) {
    const ckpt::Verification v = ckpt::verifyCheckpoint(d.path, true);
    if (fs::exists(d.path + "/manifest.json")) {
      EXPECT_TRUE(v.valid) << d.path << ": " << v.problem;
    }
  }
}

TEST_F(NetFaultTest, AStaticJobWaitsOutAPartitionAndRestartsFromItsNewestState) {
  // Exactly 2 nodes, ZeRO-1: a lost node takes its part of the optimizer
  // state along, so the job goes back to its newest checkpoint, unless the
  // healed node's rank held its part before it was fenced.
  TestNetwork net(2);
  EtcdCluster etcd(1, net.bridgeAddress());
  const Run r = makeRun("static", 2, {"distribution.zero=1"});
  const std::string rdzv = "etcd://" + etcd.endpoints() + "/static";
  LinkFaults faults(net);
  std::vector<std::unique_ptr<Process>> agents;
  for (int h = 0; h < 2; ++h) agents.push_back(agentOn(net, h, r, rdzv, "2"));
  ASSERT_TRUE(waitUntil([&] { return steps(r) > 130; }, 120s)) << tail(*agents[0]);
  const int roundAtCut = lastRound(r);
  faults.partition(1);
  const auto cutAt = std::chrono::steady_clock::now();
  const int64_t atCut = steps(r);
  // Host 0 declares host 1 lost and waits, below MIN: no step is trained.
  ASSERT_TRUE(waitUntil([&] { return agents[0]->stderrSoFar().find("lost") != std::string::npos; }, 30s))
      << tail(*agents[0]);
  std::this_thread::sleep_until(cutAt + 12s);
  EXPECT_LE(steps(r), atCut + 1) << "steps were trained below MIN";
  faults.heal(1);
  expectAllExitZero(agents, 4min);
  const SampleHistory h = readSampleLog(r.samples);
  EXPECT_GT(h.stepsByRound.rbegin()->first, roundAtCut);
  // The steps after the state resumed from were trained again (none from
  // memory); every sample of every epoch once over the steps kept.
  EXPECT_LE(h.redone().size(), 100u);
  ASSERT_EQ(h.timesTrained.size(), 2u);
  for (const auto& [epoch, times] : h.timesTrained) {
    EXPECT_EQ(times.size(), 4096u) << "epoch " << epoch;
    for (const auto& [id, n] : times) ASSERT_EQ(n, 1) << "epoch " << epoch << " sample " << id;
  }
  // From the newest state after the heal: the checkpoint on disk, or both
  // nodes' memory when host 1's rank held its part before it was fenced.
  const std::string logs = rankLogs(r);
  const bool fromDisk = logs.find("resumed from " + r.runDir + "/checkpoints/step-") != std::string::npos;
  const bool fromMemory = logs.find("from the nodes' memory") != std::string::npos;
  EXPECT_TRUE(fromDisk || fromMemory);
  std::cout << "resumed from " << (fromDisk ? "the newest checkpoint" : "the nodes' memory") << "\n";
}

TEST_F(NetFaultTest, AStoppedNodeIsLostAndWritesNothingWhenItResumes) {
  // Host 1 hangs: its rank stops after step 101 (COHORT_FAULT sleep) with
  // its checkpoint writer held in the middle of step 100, and then its
  // agent and rank are stopped with SIGSTOP (alive, silent: no connection
  // is reset) for longer than elastic.node_timeout_s. Once the others have
  // gone on, the rank resumes first: its writer wakes to find the fence.
  TestNetwork net(3);
  EtcdCluster etcd(1, net.bridgeAddress());
  const Run r = makeRun("stopped", 4, {"checkpoint.keep_last=100"});
  const std::string rdzv = "etcd://" + etcd.endpoints() + "/stopped";
  std::vector<std::unique_ptr<Process>> agents;
  for (int h = 0; h < 3; ++h) {
    std::map<std::string, std::string> e;
    if (h == 1) e = {{"COHORT_TEST_CKPT_PAUSE", "100:3"}, {"COHORT_FAULT", "sleep40@rank1:step101"}};
    agents.push_back(agentOn(net, h, r, rdzv, "2:3", e, 25));
  }
  FileWatch watch(r.runDir);
  ASSERT_TRUE(waitUntil([&] {
    const std::string logs = rankLogs(r);
    return logs.find("checkpoint writer paused") != std::string::npos &&
           logs.find("COHORT_FAULT: hanging") != std::string::npos;
  }, 120s)) << tail(*agents[1]);
  const int roundAtStop = lastRound(r);
  const pid_t agent = agents[1]->pid();
  const std::vector<pid_t> ranks = childrenOf(agent);
  ASSERT_EQ(ranks.size(), 1u);
  ::kill(agent, SIGSTOP);
  ::kill(ranks[0], SIGSTOP);
  const auto stopAt = std::chrono::steady_clock::now();
  // Named as lost by a survivor; the others train on.
  ASSERT_TRUE(waitUntil([&] { return lastRound(r) > roundAtStop && steps(r) > 130; }, 60s)) << tail(*agents[0]);
  const std::string survivors = agents[0]->stderrSoFar() + agents[2]->stderrSoFar();
  EXPECT_NE(survivors.find("node(s) host-1 lost"), std::string::npos) << tail(*agents[0]);
  EXPECT_GE(fence::lostIn(r.runDir, "host-1"), roundAtStop);
  std::this_thread::sleep_until(stopAt + 12s);
  const auto resumedAt = std::chrono::steady_clock::now();
  ::kill(ranks[0], SIGCONT);
  const bool fenced = waitUntil(
      [&] { return rankLogs(r).find("fenced: the other nodes declared this node lost") != std::string::npos; }, 15s);
  ::kill(agent, SIGCONT);
  EXPECT_TRUE(fenced) << "the resumed rank's writer did not meet the fence: " << readText(r.runDir + "/logs/rank-1.log");
  expectAllExitZero(agents, 4min);
  expectExactlyOnce(r.samples, 4);
  // Nothing of step 100 (which the others never write again) came into
  // the run from the resumed rank.
  const auto late = watch.appearedAfter("checkpoints/step-100/", resumedAt);
  EXPECT_TRUE(late.empty()) << "the stopped rank's writer wrote " << fmt::format("{}", fmt::join(late, ", "));
}

}  // namespace
}  // namespace cohort::test
