// Elastic training across test hosts: network namespaces with their own
// addresses on one bridge (util/netns.h), etcd on the bridge, one `cohort
// agent` per host. A host's link is cut (no connection is reset: the others
// notice by its lapsed lease); a 3-member etcd cluster loses its leader
// mid-run, and again in the middle of a resize; an etcd member on a host of
// its own is partitioned (util/netfault.h). Each asserts the final state and
// that every sample was trained on exactly once.
// Needs root; skips with the reason otherwise.

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/elastic/kv.h"
#include "elastic/elastic_util.h"
#include "util/etcd.h"
#include "util/jobs.h"
#include "util/netfault.h"
#include "util/netns.h"
#include "util/process.h"
#include "util/skip.h"

namespace cohort::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = multiHostUnavailable(); !why.empty()) COHORT_SKIP(why);
    fs::create_directories(dir_.file("samples"));
    fs::create_directories(dir_.file("shm"));
    job_ = dir_.file("job.yaml");
    writeText(job_, elasticJobYaml(dir_.file("runs"), 2, "  state_dir: " + dir_.file("shm") + "\n"));
  }
  std::map<std::string, std::string> env() const {
    auto e = elasticEnv(dir_.file("samples"), 8);
    e["COHORT_STORE_TOKEN"] = "multihost-test-token-0123456789abcdef";
    return e;
  }
  std::unique_ptr<Process> agentOn(const TestNetwork& net, int host, const std::string& rdzv,
                                   const std::vector<std::string>& extra = {}) {
    AgentSpec s{fmt::format("host-{}", host), rdzv, "2:3", job_, dir_.file("run"), net.on(host), extra};
    return startAgent(s, env());
  }
  int steps() const { return static_cast<int>(readSampleLog(dir_.file("samples")).lastStep); }
  // The job's 2 epochs: every sample of each trained on exactly once, no
  // step applied twice.
  void expectExact() const { expectExactlyOnce(dir_.file("samples"), 2); }

  TempDir dir_;
  std::string job_;
};

TEST_F(MultiHostTest, ACutLinkIsSeenByItsLeaseAndTheOthersGoOn) {
  TestNetwork net(3);
  EtcdCluster etcd(1, net.bridgeAddress());
  const std::string rdzv = "etcd://" + etcd.endpoints() + "/cut";
  std::vector<std::unique_ptr<Process>> agents;
  for (int h = 0; h < 3; ++h) agents.push_back(agentOn(net, h, rdzv));
  ASSERT_TRUE(waitUntil([&] { return steps() > 60; }, 90s)) << agents[0]->stderrSoFar();
  const auto cutAt = std::chrono::steady_clock::now();
  net.cut(2);
  const int atCut = steps();
  auto lastRound = [&] {
    const SampleHistory h = readSampleLog(dir_.file("samples"));
    return h.stepsByRound.empty() ? -1 : h.stepsByRound.rbegin()->first;
  };
  const int roundAtCut = lastRound();
  // The others notice within elastic.node_timeout_s (3 s) plus a poll, not
  // at the collective timeout (60 s), and train on: the first step of a
  // new round.
  ASSERT_TRUE(waitUntil([&] { return lastRound() > roundAtCut; }, 40s)) << agents[0]->stderrSoFar();
  const double back = std::chrono::duration<double>(std::chrono::steady_clock::now() - cutAt).count();
  RecordProperty("seconds_from_cut_to_first_step", std::to_string(back));
  std::cout << "back to training " << back << " s after the cut\n";
  EXPECT_LT(back, 30.0);
  ASSERT_TRUE(waitUntil([&] { return steps() > atCut + 20; }, 40s)) << agents[0]->stderrSoFar();
  for (int h = 0; h < 2; ++h) {
    const ProcessResult r = agents[static_cast<size_t>(h)]->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
  }
  // The cut host cannot reach etcd: it gives up (or is killed below).
  agents[2]->signal(SIGKILL);
  (void)agents[2]->wait(10s);
  expectExact();
}

TEST_F(MultiHostTest, JoinLeaveKillAndBelowMinAcrossHosts) {
  // h0 and h1 start; h2 joins; h1 leaves on SIGTERM; h2 is killed (the job
  // is below MIN = 2 and waits); h3 arrives and the job finishes.
  TestNetwork net(4);
  EtcdCluster etcd(1, net.bridgeAddress());
  const std::string rdzv = "etcd://" + etcd.endpoints() + "/changes";
  std::vector<std::unique_ptr<Process>> agents(4);
  agents[0] = agentOn(net, 0, rdzv);
  agents[1] = agentOn(net, 1, rdzv);
  ASSERT_TRUE(waitUntil([&] { return steps() > 40; }, 90s)) << agents[0]->stderrSoFar();
  agents[2] = agentOn(net, 2, rdzv);
  const int beforeJoin = steps();
  ASSERT_TRUE(waitUntil([&] { return readSampleLog(dir_.file("samples")).stepsByRound.size() >= 2 &&
                                     steps() > beforeJoin + 40; }, 60s));
  agents[1]->signal(SIGTERM);
  const ProcessResult left = agents[1]->wait(60s);
  EXPECT_EQ(left.exitCode, 0) << left.describe();
  const int afterLeave = steps();
  ASSERT_TRUE(waitUntil([&] { return steps() > afterLeave + 40; }, 60s));
  for (pid_t rank : childrenOf(agents[2]->pid())) ::kill(rank, SIGKILL);
  agents[2]->signal(SIGKILL);
  (void)agents[2]->wait(10s);
  const int alone = steps();
  std::this_thread::sleep_for(4s);
  EXPECT_EQ(steps(), alone) << "a step ran below MIN";
  agents[3] = agentOn(net, 3, rdzv);
  for (int h : {0, 3}) {
    const ProcessResult r = agents[static_cast<size_t>(h)]->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << "host " << h << ": " << r.describe();
  }
  expectExact();
  EXPECT_GE(readSampleLog(dir_.file("samples")).stepsByRound.size(), 4u);
}

TEST_F(MultiHostTest, LosingEtcdsLeaderMidRunChangesNothing) {
  TestNetwork net(2);
  EtcdCluster etcd(3, net.bridgeAddress());
  const std::string rdzv = "etcd://" + etcd.endpoints() + "/leader";
  std::vector<std::unique_ptr<Process>> agents;
  for (int h = 0; h < 2; ++h) agents.push_back(agentOn(net, h, rdzv));
  ASSERT_TRUE(waitUntil([&] { return steps() > 60; }, 90s)) << agents[0]->stderrSoFar();
  const int leader = etcd.leader();
  ASSERT_GE(leader, 0);
  etcd.kill(leader);
  expectAllExitZero(agents, 3min);
  // One round from start to end: the election did not disturb training.
  const SampleHistory h = readSampleLog(dir_.file("samples"));
  EXPECT_EQ(h.stepsByRound.size(), 1u);
  expectExact();
}

TEST_F(MultiHostTest, LosingEtcdsLeaderDuringAResizeChangesNothing) {
  TestNetwork net(3);
  EtcdCluster etcd(3, net.bridgeAddress());
  const std::string rdzv = "etcd://" + etcd.endpoints() + "/resize";
  std::vector<std::unique_ptr<Process>> agents;
  for (int h = 0; h < 2; ++h) agents.push_back(agentOn(net, h, rdzv));
  ASSERT_TRUE(waitUntil([&] { return steps() > 60; }, 90s)) << agents[0]->stderrSoFar();
  // A third node asks to join: the moment the record says so, the resize
  // is under way (the others stop at a step boundary and open a round),
  // and etcd loses its leader.
  elastic::KvOptions ko;
  ko.retryFor = 5000ms;
  auto kv = elastic::connectKv("etcd://" + etcd.endpoints(), ko);
  agents.push_back(agentOn(net, 2, rdzv));
  ASSERT_TRUE(waitUntil([&] {
    const auto v = kv->get("/cohort/resize/state");
    return v && v->value.find("host-2") != std::string::npos;
  }, 60s));
  const int leader = etcd.leader();
  ASSERT_GE(leader, 0);
  etcd.kill(leader);
  expectAllExitZero(agents, 3min);
  const SampleHistory h = readSampleLog(dir_.file("samples"));
  EXPECT_GE(h.stepsByRound.size(), 2u) << "the third node was never admitted";
  expectExact();
}

TEST_F(MultiHostTest, APartitionedEtcdMemberChangesNothing) {
  // Nodes on hosts 0 and 1; one etcd member on each of hosts 2..4. The
  // leader's host is cut off for 15 s: the others elect a new one, and the
  // agents move to a member that answers before any lease lapses.
  TestNetwork net(5);
  EtcdCluster etcd({EtcdHost{net.address(2), net.on(2)}, EtcdHost{net.address(3), net.on(3)},
                    EtcdHost{net.address(4), net.on(4)}});
  LinkFaults faults(net);
  const std::string rdzv = "etcd://" + etcd.endpoints() + "/member";
  // 6 epochs: the job outlasts the partition.
  std::vector<std::unique_ptr<Process>> agents;
  for (int h = 0; h < 2; ++h) agents.push_back(agentOn(net, h, rdzv, {"--set", "training.epochs=6"}));
  ASSERT_TRUE(waitUntil([&] { return steps() > 60; }, 90s)) << agents[0]->stderrSoFar();
  const int leader = etcd.leader();
  ASSERT_GE(leader, 0);
  faults.partition(2 + leader);
  const int atCut = steps();
  // Training goes on while the member is cut off.
  EXPECT_TRUE(waitUntil([&] { return steps() > atCut + 100; }, 60s));
  std::this_thread::sleep_for(15s);
  EXPECT_GT(faults.dropped(2 + leader), 0);
  faults.heal(2 + leader);
  expectAllExitZero(agents, 3min);
  // No node was taken for lost: one round from start to end.
  EXPECT_EQ(readSampleLog(dir_.file("samples")).stepsByRound.size(), 1u) << agents[0]->stderrSoFar() << agents[1]->stderrSoFar();
  expectExactlyOnce(dir_.file("samples"), 6);
}

}  // namespace
}  // namespace cohort::test
