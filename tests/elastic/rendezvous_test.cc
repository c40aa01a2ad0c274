// Elastic rendezvous on a real etcd (one member, and a 3-member cluster
// that loses its leader) and on cohort's own store: rounds form with MIN..MAX
// nodes, ranks are the same on every node, a late node waits and is seen,
// a dead member is seen within the liveness TTL, a different job file is
// refused, and the job closes.

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/elastic/kv.h"
#include "cohort/elastic/rendezvous.h"
#include "util/etcd.h"
#include "util/process.h"
#include "util/skip.h"

namespace cohort::elastic {
namespace {

using namespace std::chrono_literals;
using test::EtcdCluster;

KvOptions fastOptions() {
  KvOptions o;
  o.aliveTtl = 2000ms;
  o.retryFor = 15000ms;
  return o;
}

RendezvousOptions nodeOptions(const std::string& node, int min, int max) {
  RendezvousOptions o;
  o.prefix = "/cohort/test-job";
  o.jobId = "test-job";
  o.nodeId = node;
  o.address = "127.0.0.1";
  o.jobHash = "hash-a";
  o.minNodes = min;
  o.maxNodes = max;
  o.lastCall = 500ms;
  o.poll = 100ms;
  return o;
}

// A node: its own connection, liveness key and rendezvous.
struct Node {
  Node(const std::string& url, RendezvousOptions o)
      : kv(connectKv(url, fastOptions())), rdzv(*kv, std::move(o)) {
    kv->keepAlive(aliveKey(rdzv.options().prefix, rdzv.options().nodeId), "127.0.0.1");
  }
  std::unique_ptr<Kv> kv;
  Rendezvous rdzv;
};

class RendezvousTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "etcd") {
      if (test::etcdBinary().empty()) COHORT_SKIP("etcd is not installed (scripts/install-deps.sh)");
      etcd_ = std::make_unique<EtcdCluster>(1);
      url_ = "etcd://" + etcd_->endpoints();
    } else {
      url_ = "store://127.0.0.1:" + std::to_string(test::freePort());
      // The first node's connection hosts the store.
    }
  }
  std::unique_ptr<EtcdCluster> etcd_;
  std::string url_;
};

TEST_P(RendezvousTest, FormsARoundWithTheSameRanksEverywhere) {
  Node a(url_, nodeOptions("node-b", 2, 3));
  Node b(url_, nodeOptions("node-a", 2, 3));
  auto fa = std::async(std::launch::async, [&] { return a.rdzv.join(); });
  auto fb = std::async(std::launch::async, [&] { return b.rdzv.join(); });
  const Round ra = fa.get(), rb = fb.get();
  ASSERT_EQ(ra.status, Round::Status::frozen);
  ASSERT_EQ(rb.status, Round::Status::frozen);
  EXPECT_EQ(ra.round, rb.round);
  EXPECT_EQ(ra.members, (std::vector<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(ra.members, rb.members);
  EXPECT_EQ(ra.nodeRank, 1);  // sorted by node id, whoever joined first
  EXPECT_EQ(rb.nodeRank, 0);
  EXPECT_EQ(a.rdzv.check(ra).kind, Change::Kind::none);

  // A late node waits; the members see it.
  Node c(url_, nodeOptions("node-c", 2, 3));
  auto fc = std::async(std::launch::async, [&] { return c.rdzv.join(); });
  Change seen;
  for (int i = 0; i < 100 && seen.kind == Change::Kind::none; ++i) {
    seen = a.rdzv.check(ra);
    if (seen.kind == Change::Kind::none) std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(seen.kind, Change::Kind::waiting);
  EXPECT_EQ(seen.detail, "node-c");
  // The members re-form: a new round with all three.
  a.rdzv.openNext(ra, "node-c waits");
  b.rdzv.openNext(rb, "node-c waits");  // a no-op: already opened
  auto fa2 = std::async(std::launch::async, [&] { return a.rdzv.join(); });
  auto fb2 = std::async(std::launch::async, [&] { return b.rdzv.join(); });
  const Round r2a = fa2.get(), r2b = fb2.get(), r2c = fc.get();
  EXPECT_EQ(r2a.round, ra.round + 1);
  EXPECT_EQ(r2a.members, (std::vector<std::string>{"node-a", "node-b", "node-c"}));
  EXPECT_EQ(r2c.nodeRank, 2);
  EXPECT_EQ(r2b.round, r2c.round);

  // Closing ends it for everyone, and for anyone who comes later.
  a.rdzv.close(0);
  EXPECT_EQ(b.rdzv.check(r2b).kind, Change::Kind::closed);
  Node d(url_, nodeOptions("node-d", 1, 3));
  EXPECT_EQ(d.rdzv.join().status, Round::Status::closed);
}

TEST_P(RendezvousTest, ADeadMemberIsSeenWithinItsTtl) {
  Node a(url_, nodeOptions("node-a", 2, 2));
  auto b = std::make_unique<Node>(url_, nodeOptions("node-b", 2, 2));
  auto fa = std::async(std::launch::async, [&] { return a.rdzv.join(); });
  const Round rb = b->rdzv.join();
  const Round ra = fa.get();
  ASSERT_EQ(ra.members.size(), 2u);
  // node-b stops renewing without saying goodbye (as a killed agent would).
  b->kv->release();
  const auto start = std::chrono::steady_clock::now();
  Change seen;
  while (seen.kind == Change::Kind::none && std::chrono::steady_clock::now() - start < 20s) {
    seen = a.rdzv.check(ra);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(seen.kind, Change::Kind::lost);
  EXPECT_EQ(seen.detail, "node-b");
  // Alone below MIN = 2, node-a gives up after belowMinFor.
  a.rdzv.openNext(ra, "node-b lost");
  RendezvousOptions o = nodeOptions("node-a", 2, 2);
  o.belowMinFor = 1500ms;
  Rendezvous again(*a.kv, o);
  EXPECT_EQ(again.join().status, Round::Status::belowMin);
  (void)rb;
}

TEST_P(RendezvousTest, AnotherJobFileUnderTheSameIdIsRefused) {
  Node a(url_, nodeOptions("node-a", 1, 2));
  ASSERT_EQ(a.rdzv.join().status, Round::Status::frozen);
  RendezvousOptions o = nodeOptions("node-b", 1, 2);
  o.jobHash = "hash-b";
  Node b(url_, o);
  try {
    b.rdzv.join();
    FAIL() << "joined a job with another job file";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("job id 'test-job' is in use by a job with another job file"),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Services, RendezvousTest, ::testing::Values("etcd", "store"),
                         [](const auto& info) { return info.param; });

TEST(RendezvousEtcd, UnreachableEtcdIsAClearErrorWithinRetryFor) {
  KvOptions o = fastOptions();
  o.retryFor = 1500ms;
  auto kv = connectKv("etcd://127.0.0.1:" + std::to_string(test::freePort()), o);
  const auto start = std::chrono::steady_clock::now();
  try {
    kv->get("/cohort/x/state");
    FAIL() << "read from nothing";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("etcd unreachable"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

TEST(RendezvousEtcd, SurvivesLosingTheLeaderOfAThreeMemberCluster) {
  if (test::etcdBinary().empty()) COHORT_SKIP("etcd is not installed (scripts/install-deps.sh)");
  EtcdCluster etcd(3);
  const std::string url = "etcd://" + etcd.endpoints();
  Node a(url, nodeOptions("node-a", 2, 2));
  Node b(url, nodeOptions("node-b", 2, 2));
  auto fa = std::async(std::launch::async, [&] { return a.rdzv.join(); });
  const Round rb = b.rdzv.join();
  const Round ra = fa.get();
  ASSERT_EQ(ra.round, rb.round);
  const int leader = etcd.leader();
  ASSERT_GE(leader, 0);
  etcd.kill(leader);
  // Reads and writes go on through the other two members (after an
  // election); the leases survive, so nobody is called dead.
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(a.rdzv.check(ra).kind, Change::Kind::none);
    std::this_thread::sleep_for(200ms);
  }
  a.rdzv.openNext(ra, "test");
  auto fa2 = std::async(std::launch::async, [&] { return a.rdzv.join(); });
  const Round rb2 = b.rdzv.join();
  EXPECT_EQ(rb2.round, ra.round + 1);
  EXPECT_EQ(fa2.get().members, rb2.members);
}

}  // namespace
}  // namespace cohort::elastic
