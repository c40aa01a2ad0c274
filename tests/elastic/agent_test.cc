// `cohort agent` with real processes on this host (one node per agent, told
// apart by COHORT_MACHINE_ID, which the agent sets): a late node joins, a
// node is killed with its ranks, a node leaves on SIGTERM, the job drops
// below MIN and a node comes back, SIGUSR2 stops the job with a checkpoint
// to resume from, SIGTERM while the agent or its rank starts stops it too,
// and bad input. Each asserts the final
// state, that no step was redone (the state came from the survivors'
// memory) and that every sample of every epoch was trained on exactly once.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/core/text.h"
#include "elastic/elastic_util.h"
#include "util/etcd.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/skip.h"

namespace cohort::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(samples());
    rdzv_ = "store://127.0.0.1:" + std::to_string(freePort()) + "/job-" + std::to_string(::getpid());
  }
  void TearDown() override {
    // Nothing is left in the memory file system but by nodes that were
    // killed (a machine that is gone cannot clean up).
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(stateDir(), ec)) {
      const std::string name = e.path().filename().string();
      bool killed = false;
      for (const auto& k : killed_) {
        killed = killed || (name.size() >= k.size() && name.compare(name.size() - k.size(), k.size(), k) == 0);
      }
      if (!killed) ADD_FAILURE() << "left behind: " << e.path();
    }
  }
  // The first agent hosts the store (store://): started alone, and waited
  // for, so that the nodes a test kills are never the host.
  std::unique_ptr<Process> startHost(const AgentSpec& a, const std::map<std::string, std::string>& env) {
    auto p = startAgent(a, env);
    EXPECT_TRUE(waitUntil([&] { return p->stderrSoFar().find("hosted by this agent") != std::string::npos; }, 30s))
        << p->stderrSoFar();
    return p;
  }
  void killNode(Process& agent, const std::string& node) {
    for (pid_t rank : childrenOf(agent.pid())) ::kill(rank, SIGKILL);
    agent.signal(SIGKILL);
    (void)agent.wait(10s);
    killed_.push_back(node);
  }
  std::string samples() const { return dir_.file("samples"); }
  std::string runDir() const { return dir_.file("run"); }
  std::string stateDir() const { return dir_.file("shm"); }
  std::string writeJob(int epochs, const std::string& extra = "") {
    const std::string path = dir_.file("job.yaml");
    writeText(path, elasticJobYaml(dir_.file("runs"), epochs,
                                   "  state_dir: " + stateDir() + "\n" + extra));
    fs::create_directories(stateDir());
    return path;
  }
  AgentSpec agent(const std::string& node, const std::string& job, const std::string& nnodes = "2:3") {
    return AgentSpec{node, rdzv_, nnodes, job, runDir(), {}, {}};
  }
  int stepsLogged() const { return static_cast<int>(readSampleLog(samples()).lastStep); }
  // Every sample of every epoch exactly once; no step applied twice.
  void expectExact(int epochs) { expectExactlyOnce(samples(), epochs); }
  nlohmann::json summary() const {
    std::ifstream in(runDir() + "/summary.json");
    return nlohmann::json::parse(in, nullptr, false);
  }
  // The agents' failure events, each with the log of every rank it names,
  // for a failed expectation to show why a round ended as it did.
  std::string failureEvents() const {
    std::string out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(runDir() + "/events", ec)) {
      for (const std::string& line : splitOn(readText(e.path().string()), '\n')) {
        const auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_object() || j.value("event", "") != "failure") continue;
        out += line + "\n";
        const std::string cause = j.value("cause", "");
        const size_t at = cause.find("rank ");
        if (at == std::string::npos) continue;
        const std::string log = runDir() + "/logs/rank-" + std::to_string(std::atoi(cause.c_str() + at + 5)) + ".log";
        out += "--- " + log + "\n" + readText(log) + "\n";
      }
    }
    return out;
  }

  TempDir dir_;
  std::string rdzv_;
  std::vector<std::string> killed_;
};

TEST_F(AgentTest, ALateNodeJoinsWithTheSurvivorsState) {
  const std::string job = writeJob(2);
  const auto env = elasticEnv(samples(), 8);
  auto a = startHost(agent("node-a", job), env);
  auto b = startAgent(agent("node-b", job), env);
  ASSERT_TRUE(waitUntil([&] { return stepsLogged() > 50; }, 60s)) << a->stderrSoFar();
  auto c = startAgent(agent("node-c", job), env);
  for (auto* p : {a.get(), b.get(), c.get()}) {
    const ProcessResult r = p->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
  }
  const SampleHistory h = readSampleLog(samples());
  EXPECT_GE(h.stepsByRound.size(), 2u) << "the late node was never admitted";
  expectExact(2);
  // keep_per_rank (the default): the job is written for 2 nodes at lr 0.05;
  // on 3 the global batch is 24 and the linear rule gives 0.075.
  const std::string log0 = readText(runDir() + "/logs/rank-0.log");
  EXPECT_NE(log0.find("3 ranks x batch 8 x 1 micro-steps = global batch 24; peak lr 0.075"),
            std::string::npos);
  const nlohmann::json s = summary();
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s.value("status", ""), "completed");
  EXPECT_GE(s["elastic"].value("rounds", 0), 2);
  // The newcomer's rank received the state over the network.
  bool received = false;
  for (const auto& e : fs::directory_iterator(runDir() + "/logs")) {
    const std::string text = readText(e.path().string());
    received = received || (text.find("from the nodes' memory (") != std::string::npos &&
                            text.find("from the nodes' memory (0 bytes") == std::string::npos);
  }
  EXPECT_TRUE(received);
}

TEST_F(AgentTest, ZeroPartsAreRedistributedWhenANodeJoins) {
  // ZeRO stage 1: each rank holds its part of the optimizer state; the
  // parts of 2 ranks become the parts of 3.
  const std::string job = writeJob(2);
  const auto env = elasticEnv(samples(), 8);
  auto zero = [&](const std::string& node) {
    AgentSpec s = agent(node, job);
    s.extraArgs = {"--set", "distribution.zero=1"};
    return s;
  };
  auto a = startHost(zero("node-a"), env);
  auto b = startAgent(zero("node-b"), env);
  ASSERT_TRUE(waitUntil([&] { return stepsLogged() > 50; }, 60s)) << a->stderrSoFar();
  auto c = startAgent(zero("node-c"), env);
  for (auto* p : {a.get(), b.get(), c.get()}) {
    const ProcessResult r = p->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
  }
  expectExact(2);
  const std::string log2 = readText(runDir() + "/logs/rank-2.log");
  EXPECT_NE(log2.find("from the nodes' memory"), std::string::npos) << log2;
  EXPECT_NE(log2.find("ZeRO stage 1"), std::string::npos);
}

TEST_F(AgentTest, AKilledNodeCostsNoStep) {
  const std::string job = writeJob(2);
  const auto env = elasticEnv(samples(), 8);
  auto a = startHost(agent("node-a", job), env);
  auto b = startAgent(agent("node-b", job), env);
  auto c = startAgent(agent("node-c", job), env);
  ASSERT_TRUE(waitUntil([&] { return stepsLogged() > 60; }, 60s)) << a->stderrSoFar();
  // kill -9 the agent and its rank: the whole node is gone at once.
  killNode(*c, "node-c");
  for (auto* p : {a.get(), b.get()}) {
    const ProcessResult r = p->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
  }
  const SampleHistory h = readSampleLog(samples());
  EXPECT_GE(h.stepsByRound.size(), 2u);
  expectExact(2);
  const nlohmann::json s = summary();
  EXPECT_EQ(s.value("status", ""), "completed");
  EXPECT_GE(s["elastic"].value("reforms", 0), 1);
  // A lost node is a membership change, not a failure (max_restarts).
  EXPECT_EQ(s["elastic"].value("failures", -1), 0) << failureEvents();
}

TEST_F(AgentTest, SigtermLetsANodeLeaveWhileTheOthersGoOn) {
  const std::string job = writeJob(2);
  const auto env = elasticEnv(samples(), 8);
  // node-a serves its counts for Prometheus (output.metrics_port).
  const int port = freePort();
  AgentSpec spec = agent("node-a", job);
  spec.extraArgs = {"--set", "output.metrics_port=" + std::to_string(port)};
  auto a = startHost(spec, env);
  auto b = startAgent(agent("node-b", job), env);
  auto c = startAgent(agent("node-c", job), env);
  ASSERT_TRUE(waitUntil([&] { return stepsLogged() > 60; }, 60s)) << a->stderrSoFar();
  const std::string metrics = scrapeMetrics(port);
  EXPECT_NE(metrics.find("cohort_elastic_nodes{node=\"node-a\"} 3"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("cohort_elastic_rounds_total{node=\"node-a\"} 1"), std::string::npos) << metrics;
  c->signal(SIGTERM);
  const ProcessResult rc = c->wait(1min);
  EXPECT_EQ(rc.exitCode, 0) << rc.describe();
  EXPECT_NE(rc.err.find("left the job after SIGTERM"), std::string::npos) << rc.err;
  for (auto* p : {a.get(), b.get()}) {
    const ProcessResult r = p->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
  }
  expectExact(2);
  EXPECT_EQ(summary()["elastic"].value("nodes_left", 0), 1);
}

TEST_F(AgentTest, TheSummaryIsWrittenWhenAnotherNodeEndsTheJobFirst) {
  // Rank 0 (node 0's) waits 2 s after the final barrier before writing
  // summary.json, so the other node's rank ends first and its agent closes
  // the job: node 0's agent takes the "ended elsewhere" path and must still
  // add the job's elastic part to the summary.
  const std::string job = writeJob(1);
  auto env = elasticEnv(samples(), 8);
  env["COHORT_TEST_SUMMARY_DELAY_MS"] = "2000";
  auto a = startHost(agent("node-a", job, "2:2"), env);
  auto b = startAgent(agent("node-b", job, "2:2"), env);
  std::string errs;
  for (auto* p : {a.get(), b.get()}) {
    const ProcessResult r = p->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    errs += r.err;
  }
  ASSERT_NE(errs.find("ended elsewhere (exit code 0)"), std::string::npos)
      << "no node saw the job closed by the other: the case is not exercised\n" << errs;
  expectExact(1);
  const nlohmann::json s = summary();
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s.value("status", ""), "completed");
  ASSERT_TRUE(s.contains("elastic")) << s.dump(2);
  EXPECT_EQ(s["elastic"].value("rounds", 0), 1);
}

TEST_F(AgentTest, BelowMinTheJobWaitsAndGoesOnWhenANodeComesBack) {
  const std::string job = writeJob(2);
  const auto env = elasticEnv(samples(), 8);
  auto a = startHost(agent("node-a", job, "2:2"), env);
  auto b = startAgent(agent("node-b", job, "2:2"), env);
  ASSERT_TRUE(waitUntil([&] { return stepsLogged() > 60; }, 60s)) << a->stderrSoFar();
  killNode(*b, "node-b");
  const int before = stepsLogged();
  std::this_thread::sleep_for(4s);  // a is alone below MIN = 2: no step can run
  EXPECT_EQ(stepsLogged(), before);
  auto b2 = startAgent(agent("node-b2", job, "2:2"), env);
  for (auto* p : {a.get(), b2.get()}) {
    const ProcessResult r = p->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
  }
  expectExact(2);
}

TEST_F(AgentTest, BelowMinTooLongWritesACheckpointAndExits75) {
  const std::string job = writeJob(3, "  below_min_timeout_s: 3\n");
  const auto env = elasticEnv(samples(), 8);
  auto a = startHost(agent("node-a", job, "2:2"), env);
  auto b = startAgent(agent("node-b", job, "2:2"), env);
  ASSERT_TRUE(waitUntil([&] { return stepsLogged() > 130; }, 60s)) << a->stderrSoFar();
  killNode(*b, "node-b");
  const ProcessResult r = a->wait(2min);
  EXPECT_EQ(r.exitCode, 75) << r.describe();
  // The state held in memory is now a checkpoint on disk, at the last step.
  const int last = stepsLogged();
  EXPECT_TRUE(fs::exists(fmt::format("{}/checkpoints/step-{}/manifest.json", runDir(), last)))
      << "no checkpoint of step " << last << "\n" << r.err;
}

// SIGUSR2 to one agent (Slurm's warning before the time limit) stops the
// whole job after a checkpoint of one step on every rank: both agents exit
// 75. Started again, the agents resume from it and the job ends as if never
// stopped. A rank leaves a SIGUSR2 that is not its agent's to the agent.
TEST_F(AgentTest, Sigusr2StopsTheWholeJobWithACheckpointToResumeFrom) {
  const std::string job = writeJob(2);
  const auto env = elasticEnv(samples(), 8);
  auto a = startHost(agent("node-a", job, "2:2"), env);
  auto b = startAgent(agent("node-b", job, "2:2"), env);
  ASSERT_TRUE(waitUntil([&] { return stepsLogged() > 60; }, 60s)) << a->stderrSoFar();
  const std::vector<pid_t> ranksOfB = childrenOf(b->pid());
  ASSERT_EQ(ranksOfB.size(), 1u);
  ::kill(ranksOfB.front(), SIGUSR2);  // not from its agent: ignored
  b->signal(SIGUSR2);
  std::string errs;
  for (auto* p : {a.get(), b.get()}) {
    const ProcessResult r = p->wait(2min);
    EXPECT_EQ(r.exitCode, 75) << r.describe();
    errs += r.err;
  }
  const std::string rank1 = readText(runDir() + "/logs/rank-1.log");
  EXPECT_NE(rank1.find("SIGUSR2 from pid " + std::to_string(::getpid()) + ": left to the agent"), std::string::npos)
      << rank1;
  const int last = stepsLogged();
  ASSERT_TRUE(fs::exists(fmt::format("{}/checkpoints/step-{}/manifest.json", runDir(), last)))
      << "no checkpoint of step " << last << "\n" << errs;
  // A new rendezvous (the store went with node-a's agent): the job resumes.
  rdzv_ = "store://127.0.0.1:" + std::to_string(freePort()) + "/job-" + std::to_string(::getpid());
  auto a2 = startHost(agent("node-a", job, "2:2"), env);
  auto b2 = startAgent(agent("node-b", job, "2:2"), env);
  for (auto* p : {a2.get(), b2.get()}) {
    const ProcessResult r = p->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
  }
  expectExact(2);
  EXPECT_EQ(summary().value("status", ""), "completed");
}

// SIGTERM, with --on-sigterm stop as the Slurm script runs the agents,
// while the agent starts (before it takes signals) and while its rank starts
// (before the rank's signal thread): the job stops with exit 75 (with a
// checkpoint of its first steps once the rank had started), and the agent
// started again completes it. The processes pause at those points
// (COHORT_TEST_PAUSE) until the signal is sent.
TEST_F(AgentTest, SigtermWhileStartingStopsTheJobAndARerunCompletesIt) {
  const std::string job = writeJob(1);
  for (const std::string point : {"agent", "start"}) {
    SCOPED_TRACE(point);
    const std::string pause = dir_.file("pause-" + point);
    fs::create_directories(pause);
    auto env = elasticEnv(samples(), 0);
    env["COHORT_TEST_PAUSE"] = point + ":" + pause;
    AgentSpec s = agent("node-" + point, job, "1:1");
    s.runDir = dir_.file("run-" + point);
    s.extraArgs = {"--on-sigterm", "stop"};
    auto a = startAgent(s, env);
    ASSERT_TRUE(waitUntil([&] { return pausedAt(pause, point).size() == 1 || a->exited(); }, 60s))
        << a->stderrSoFar();
    a->signal(SIGTERM);
    // Held, blocked since the first instruction, not the end of the process.
    for (pid_t pid : pausedAt(pause, point)) {
      // The agent passes it to its rank from its loop: soon, not at once.
      EXPECT_TRUE(waitUntil([&] { return signalPending(pid, SIGTERM); }, 30s)) << pid;
    }
    writeText(pause + "/" + point + ".go", "");
    const ProcessResult r = a->wait(2min);
    EXPECT_EQ(r.exitCode, 75) << r.describe();
    if (point == "start") {
      const std::string said = r.err + readText(s.runDir + "/logs/rank-0.log");
      EXPECT_NE(said.find("received SIGTERM while starting"), std::string::npos) << said;
      EXPECT_NE(said.find("stopped on request after step"), std::string::npos) << said;
    }
    // Started again, on a new rendezvous (the store went with the agent).
    rdzv_ = "store://127.0.0.1:" + std::to_string(freePort()) + "/job-" + point + std::to_string(::getpid());
    AgentSpec again = agent("node-" + point, job, "1:1");
    again.runDir = s.runDir;
    const ProcessResult done = startAgent(again, elasticEnv(samples(), 0))->wait(3min);
    EXPECT_EQ(done.exitCode, 0) << done.describe();
    std::ifstream in(s.runDir + "/summary.json");
    const auto summary = nlohmann::json::parse(in, nullptr, false);
    ASSERT_TRUE(summary.is_object()) << done.err;
    EXPECT_EQ(summary.value("status", ""), "completed") << summary.dump();
    if (point == "start") {
      EXPECT_GE(summary.value("resumed_from", nlohmann::json::object()).value("step", 0), 1) << summary.dump();
    }
  }
}

TEST_F(AgentTest, BadInputIsRefusedWithAClearMessage) {
  const std::string job = writeJob(1);
  ProcessResult r = cohort({"agent", job, "--nnodes", "3:2", "--rdzv", rdzv_});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("MIN must be at least 1 and at most MAX"), std::string::npos) << r.err;

  r = cohort({"agent", job, "--nnodes", "1:2", "--rdzv", "store://127.0.0.1:1"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("JOB_ID"), std::string::npos) << r.err;

  // keep_global must divide at every size --nnodes allows.
  r = cohort({"agent", job, "--nnodes", "1:3", "--rdzv", rdzv_, "--set",
              "elastic.batch_policy=keep_global"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("not a whole number of batches of 3 ranks"), std::string::npos) << r.err;

  // A node whose job file differs never joins: the first node holds the id.
  auto a = startAgent(agent("node-a", job, "2:2"), {});
  ASSERT_TRUE(waitUntil([&] { return a->stderrSoFar().find("rendezvous round 0") != std::string::npos; }, 30s));
  r = cohort({"agent", job, "--nnodes", "2:2", "--rdzv", rdzv_, "--node-id", "node-b", "--run-dir",
              runDir(), "--set", "training.optimizer.lr=0.1"},
             {}, 1min);
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("is in use by a job with another job file"), std::string::npos) << r.err;
  a->signal(SIGTERM);
  EXPECT_EQ(a->wait(30s).exitCode, 0);

  // An unreachable etcd: a clear error once elastic.rdzv_timeout_s passes.
  r = cohort({"agent", job, "--nnodes", "1:1", "--rdzv",
              "etcd://127.0.0.1:" + std::to_string(freePort()) + "/x", "--set",
              "elastic.rdzv_timeout_s=2"},
             {}, 1min);
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("etcd unreachable"), std::string::npos) << r.err;
}

TEST_F(AgentTest, EtcdRendezvousAndBatchPolicies) {
  if (etcdBinary().empty()) COHORT_SKIP("etcd is not installed (scripts/install-deps.sh)");
  EtcdCluster etcd(1);
  rdzv_ = "etcd://" + etcd.endpoints() + "/policy";
  // keep_global: 2 nodes x batch 8 x 2 micro-steps at the nominal size;
  // with 4 nodes the global batch stays 32 with 1 micro-step.
  const std::string job = writeJob(1, "  batch_policy: keep_global\n");
  std::vector<std::unique_ptr<Process>> agents;
  for (const char* n : {"n1", "n2", "n3", "n4"}) {
    AgentSpec s = agent(n, job, "4:4");
    s.extraArgs = {"--set", "training.accumulate_steps=2"};
    agents.push_back(startAgent(s, elasticEnv(samples(), 0)));
  }
  for (auto& p : agents) {
    const ProcessResult r = p->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
  }
  const std::string log0 = readText(runDir() + "/logs/rank-0.log");
  EXPECT_NE(log0.find("4 ranks x batch 8 x 1 micro-steps = global batch 32"), std::string::npos) << log0;
}

}  // namespace
}  // namespace cohort::test
