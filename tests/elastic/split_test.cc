// Elastic training of a split model (docs/elastic.md, "Pipelines and tensor
// splits"): a GPT in 2 pipeline stages, one data replica per test host
// (network namespaces, util/netns.h; etcd on the bridge). A host is lost
// and the job goes on at 1 replica from the survivor's memory; a host joins
// and it goes back to 2. Every sample of every epoch is trained on exactly
// once. With elastic.gives: stages, the replicas stay and the pipeline
// gives: the survivors' state is restaged into one stage. A tensor-parallel
// job keeps its split: one replica of 2 slices per host. When one slice's
// collective fails where the other's completed, both hold the same step.
// Needs root; skips with the reason otherwise.

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <signal.h>

#include <filesystem>
#include <regex>
#include <thread>

#include "elastic/elastic_util.h"
#include "util/corpus.h"
#include "util/etcd.h"
#include "util/jobs.h"
#include "util/netns.h"
#include "util/process.h"
#include "util/skip.h"

namespace cohort::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class ElasticSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = multiHostUnavailable(); !why.empty()) COHORT_SKIP(why);
    fs::create_directories(dir_.file("samples"));
    fs::create_directories(dir_.file("shm"));
    writeText(dir_.file("corpus.txt"), corpus(40'000));
    const ProcessResult tok = cohort({"data", "tokenize", dir_.file("corpus.txt"), dir_.file("tok"), "--no-progress"});
    ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  }
  // `nodes` x 2 ranks: a replica of a 2-stage pipeline (`split`) on each,
  // `epochs` epochs.
  void writeJob(const std::string& elastic, const std::string& split = "pipeline: {stages: 2}", int nodes = 2,
                int epochs = 2) {
    job_ = dir_.file("job.yaml");
    writeText(job_, elasticGptJobYaml(dir_.file("runs"), dir_.file("tok/train"), 2, epochs,
                                      fmt::format("  nodes: {}\n  procs_per_node: 2\n  {}", nodes, split)) +
                        "  state_dir: " + dir_.file("shm") + "\n" + elastic);
  }
  std::unique_ptr<Process> agentOn(const TestNetwork& net, int host, const std::string& rdzv) {
    AgentSpec s{fmt::format("host-{}", host), rdzv, "1:2", job_, dir_.file("run"), net.on(host), {}};
    auto e = elasticEnv(dir_.file("samples"), 4);
    e["COHORT_STORE_TOKEN"] = "split-test-token-0123456789abcdef";
    return startAgent(s, e);
  }
  int steps() const { return static_cast<int>(readSampleLog(dir_.file("samples")).lastStep); }
  size_t rounds() const { return readSampleLog(dir_.file("samples")).stepsByRound.size(); }
  std::string rank0() const { return readText(dir_.file("run/logs/rank-0.log")); }
  // The token windows of the training data, as rank 0's log gives them.
  size_t windows() const {
    std::smatch m;
    const std::string log = rank0();
    return std::regex_search(log, m, std::regex("; (\\d+) windows of")) ? std::stoul(m[1]) : 0;
  }

  // Host 1 is killed (its agent and ranks) once steps ran; host 0 goes on
  // alone; host 2 joins; the job completes on 2 hosts.
  void loseAHostAndGrowBack(const std::string& jobId) {
    TestNetwork net(3);
    EtcdCluster etcd(1, net.bridgeAddress());
    const std::string rdzv = "etcd://" + etcd.endpoints() + "/" + jobId;
    std::vector<std::unique_ptr<Process>> agents(3);
    agents[0] = agentOn(net, 0, rdzv);
    agents[1] = agentOn(net, 1, rdzv);
    ASSERT_TRUE(waitUntil([&] { return steps() > 30; }, 90s)) << agents[0]->stderrSoFar();
    for (pid_t rank : childrenOf(agents[1]->pid())) ::kill(rank, SIGKILL);
    agents[1]->signal(SIGKILL);
    (void)agents[1]->wait(10s);
    ASSERT_TRUE(waitUntil([&] { return rounds() >= 2; }, 60s)) << agents[0]->stderrSoFar();
    const int alone = steps();
    ASSERT_TRUE(waitUntil([&] { return steps() > alone + 20; }, 60s)) << agents[0]->stderrSoFar();
    agents[2] = agentOn(net, 2, rdzv);
    for (int h : {0, 2}) {
      const ProcessResult r = agents[static_cast<size_t>(h)]->wait(3min);
      EXPECT_EQ(r.exitCode, 0) << "host " << h << ": " << r.describe();
    }
    EXPECT_GE(rounds(), 3u) << "the host that joined was never admitted";
    const size_t n = windows();
    ASSERT_GT(n, 1000u) << rank0();
    expectExactlyOnce(dir_.file("samples"), 2, n);
  }

  TempDir dir_;
  std::string job_;
};

TEST_F(ElasticSplit, APipelineLosesAHostGoesOnAtOneReplicaAndGrowsBack) {
  writeJob("");
  loseAHostAndGrowBack("pipe");
  const std::string log = rank0();
  EXPECT_NE(log.find("mesh: 2 data replicas x 2 pipeline stages"), std::string::npos) << log;
  EXPECT_NE(log.find("mesh: 1 data replicas x 2 pipeline stages"), std::string::npos) << log;
  // The survivor held its replica whole: no round went back to disk.
  EXPECT_NE(log.find("from the nodes' memory"), std::string::npos) << log;
  EXPECT_EQ(log.find("resumed from " + dir_.file("run/checkpoints")), std::string::npos) << log;
}

TEST_F(ElasticSplit, WithStagesGivingTheSurvivorsTrainTheWholeModelOnEachRank) {
  writeJob("  gives: stages\n");
  loseAHostAndGrowBack("stages");
  const std::string log = rank0();
  EXPECT_NE(log.find("this round's 2 ranks: 2 data replicas x 1 pipeline stage x 1 tensor rank (elastic.gives "
                     "stages; the job file asks for 2 stages)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("written by 2 pipeline stages"), std::string::npos) << "not restaged: " << log;
  EXPECT_NE(log.find("mesh: 2 data replicas x 2 pipeline stages"), std::string::npos) << log;
}

TEST_F(ElasticSplit, ATensorSplitJobKeepsItsSplitAcrossResizes) {
  writeJob("", "tensor: 2");
  loseAHostAndGrowBack("tensor");
  const std::string log = rank0();
  EXPECT_NE(log.find("this round's 2 ranks: 1 data replica x 1 pipeline stage x 2 tensor ranks"), std::string::npos)
      << log;
  EXPECT_NE(log.find("mesh: 2 data replicas x 1 pipeline stages x 2 tensor ranks"), std::string::npos) << log;
  EXPECT_NE(log.find("from the nodes' memory"), std::string::npos) << log;
}

// A collective over the machines can complete on one slice and fail on the
// other (a peer lost halfway through it). The slice whose collective failed
// holds the last step and leaves; the other must not take the step either,
// or the node would hold two different steps and no whole state.
TEST_F(ElasticSplit, WhenOneSlicesCollectiveFailsBothSlicesHoldTheSameStep) {
  writeJob("", "tensor: 2", 1, 1);
  const std::string rdzv = "store://127.0.0.1:" + std::to_string(freePort()) + "/slices";
  AgentSpec a{"host-0", rdzv, "1:1", job_, dir_.file("run"), {}, {}};
  auto env = elasticEnv(dir_.file("samples"), 0);
  env["COHORT_FAULT"] = "commfail@rank1:step20";
  auto agent = startAgent(a, env);
  const ProcessResult r = agent->wait(3min);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string log = rank0();
  // Rank 0 stopped at the step rank 1 failed in, not one step later.
  EXPECT_NE(log.find("the round broke at step 20"), std::string::npos) << log;
  EXPECT_NE(log.find("state of step 19 held in"), std::string::npos) << log;
  EXPECT_NE(log.find("taking up step 19 from the nodes' memory"), std::string::npos) << log;
  EXPECT_EQ(log.find("is not whole"), std::string::npos) << log;
  EXPECT_GE(rounds(), 2u);
  const size_t n = windows();
  ASSERT_GT(n, 1000u) << log;
  expectExactlyOnce(dir_.file("samples"), 1, n);
}

}  // namespace
}  // namespace cohort::test
