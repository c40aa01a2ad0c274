// The rendezvous is not open to the network: etcd over TLS (etcds://) with
// client certificates, or with etcd's own users. A client with a
// certificate the members trust reads and writes; one without, one with a
// certificate of another CA, and a plain etcd:// client are refused at
// once, with a message that says why; a user with the wrong password is
// refused; an elastic job over etcds:// trains to the end, and an agent
// without its certificate exits naming it.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/elastic/kv.h"
#include "elastic/elastic_util.h"
#include "util/certs.h"
#include "util/etcd.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/skip.h"

namespace cohort::test {
namespace {

using namespace std::chrono_literals;
using elastic::KvOptions;
namespace fs = std::filesystem;

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (etcdBinary().empty()) COHORT_SKIP("etcd is not installed (scripts/install-deps.sh)");
    ca_ = std::make_unique<TestCa>(dir_.path(), "cohort");
    server_ = ca_->issue("etcd", {"127.0.0.1"});
    client_ = ca_->issue("node-a");
    TestCa rogue(dir_.path(), "rogue");
    rogueCa_ = rogue.caFile();
    rogueClient_ = rogue.issue("node-x");
  }
  EtcdTls tls(bool clientCertAuth) const {
    return EtcdTls{ca_->caFile(), server_.certFile, server_.keyFile, client_.certFile, client_.keyFile,
                   clientCertAuth};
  }
  static KvOptions options(const std::string& ca, const IssuedCert& cert) {
    KvOptions o;
    o.retryFor = 20000ms;
    o.aliveTtl = 4000ms;
    o.etcdCaFile = ca;
    o.etcdCertFile = cert.certFile;
    o.etcdKeyFile = cert.keyFile;
    return o;
  }
  // What connecting with `o` to `url` says when it reads a key, and how
  // long it took: "" when it read.
  static std::string refusal(const std::string& url, const KvOptions& o, double& seconds) {
    const auto start = std::chrono::steady_clock::now();
    std::string what;
    try {
      elastic::connectKv(url, o)->get("/cohort/probe");
    } catch (const CommError& e) {
      what = e.what();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return what;
  }

  TempDir dir_;
  std::unique_ptr<TestCa> ca_;
  IssuedCert server_, client_, rogueClient_;
  std::string rogueCa_;
};

TEST_F(EtcdTlsTest, ATrustedCertificateTalksAndOthersAreRefusedAtOnce) {
  EtcdCluster etcd({EtcdHost{"127.0.0.1", {}}}, tls(true));
  const std::string url = "etcds://" + etcd.endpoints();
  {
    auto kv = elastic::connectKv(url, options(ca_->caFile(), client_));
    EXPECT_NE(kv->describe().find("(TLS)"), std::string::npos);
    EXPECT_TRUE(kv->compareAndSet("/cohort/k", 0, "v1"));
    const auto v = kv->get("/cohort/k");
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(v->value, "v1");
    kv->keepAlive("/cohort/alive/node-a", "127.0.0.1");
    EXPECT_TRUE(kv->alive("/cohort/alive/node-a"));
    kv->release();
  }
  double s = 0;
  // No client certificate: the handshake is refused, and not retried for
  // retryFor (20 s) as an outage would be.
  KvOptions none = options(ca_->caFile(), {});
  std::string why = refusal(url, none, s);
  EXPECT_NE(why.find("certificate"), std::string::npos) << why;
  EXPECT_LT(s, 10.0) << why;
  // A certificate of another CA.
  why = refusal(url, options(ca_->caFile(), rogueClient_), s);
  EXPECT_FALSE(why.empty());
  EXPECT_LT(s, 10.0) << why;
  // The members' certificate checked against another CA: this client
  // refuses them.
  why = refusal(url, options(rogueCa_, client_), s);
  EXPECT_NE(why.find("certificate"), std::string::npos) << why;
  // Plain http to the TLS port: no answer, retried as an outage (a member
  // may be restarting), then named.
  KvOptions plain;
  plain.retryFor = 2000ms;
  why = refusal("etcd://" + etcd.endpoints(), plain, s);
  EXPECT_NE(why.find("use etcds://"), std::string::npos) << why;
  // TLS settings on a plain URL are a mistake in the job.
  EXPECT_THROW(elastic::connectKv("etcd://" + etcd.endpoints(), options(ca_->caFile(), client_)), ConfigError);
}

TEST_F(EtcdTlsTest, AnEtcdUserWithItsPasswordAndNoOneElse) {
  // Tokens that expire after 2 s idle, so that the client must ask again.
  EtcdCluster etcd({EtcdHost{"127.0.0.1", {}}}, tls(false), {"--auth-token-ttl", "2"});
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"user", "add", "root", "--new-user-password=root-password"},
        {"role", "add", "cohort"},
        {"role", "grant-permission", "cohort", "--prefix=true", "readwrite", "/cohort/"},
        {"user", "add", "agent", "--new-user-password=agent-password"},
        {"user", "grant-role", "agent", "cohort"},
        {"auth", "enable"}}) {
    const ProcessResult r = etcd.ctl(cmd);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
  }
  const std::string url = "etcds://" + etcd.endpoints();
  KvOptions o = options(ca_->caFile(), {});
  o.etcdUser = "agent";
  o.etcdPassword = "agent-password";
  {
    auto kv = elastic::connectKv(url, o);
    EXPECT_TRUE(kv->compareAndSet("/cohort/k", 0, "v1"));
    EXPECT_EQ(kv->get("/cohort/k")->value, "v1");
    kv->keepAlive("/cohort/alive/node-a", "127.0.0.1");
    EXPECT_TRUE(kv->alive("/cohort/alive/node-a"));
    EXPECT_FALSE(kv->waitChange("/cohort/k", kv->get("/cohort/k")->version, 300ms));
    kv->release();
    // The token expired meanwhile: the client authenticates again.
    std::this_thread::sleep_for(4s);
    kv->put("/cohort/k", "v2");
    EXPECT_EQ(kv->get("/cohort/k")->value, "v2");
    kv->release();
  }
  double s = 0;
  o.etcdPassword = "wrong";
  std::string why = refusal(url, o, s);
  EXPECT_NE(why.find("authenticating as etcd user 'agent'"), std::string::npos) << why;
  EXPECT_EQ(why.find("wrong"), std::string::npos) << "the password was logged: " << why;
  EXPECT_LT(s, 10.0);
  // Without a user: etcd says no.
  why = refusal(url, options(ca_->caFile(), {}), s);
  EXPECT_FALSE(why.empty());
  EXPECT_LT(s, 10.0);
}

TEST_F(EtcdTlsTest, AnElasticJobOverTlsAndAnAgentWithoutItsCertificate) {
  EtcdCluster etcd({EtcdHost{"127.0.0.1", {}}}, tls(true));
  fs::create_directories(dir_.file("samples"));
  fs::create_directories(dir_.file("shm"));
  const std::string keys = "  state_dir: " + dir_.file("shm") + "\n  etcd_ca_file: " + ca_->caFile() + "\n";
  const std::string job = dir_.file("job.yaml");
  writeText(job, elasticJobYaml(dir_.file("runs"), 1, keys));
  const std::string rdzv = "etcds://" + etcd.endpoints() + "/tls";
  const auto env = elasticEnv(dir_.file("samples"), 0);
  // Each node presents its own certificate (--set: it is not part of the
  // job's hash).
  auto node = [&](const std::string& id, const IssuedCert& cert) {
    return startAgent(AgentSpec{id, rdzv, "2", job, dir_.file("run"), {},
                                {"--set", "elastic.etcd_cert_file=" + cert.certFile, "--set",
                                 "elastic.etcd_key_file=" + cert.keyFile}},
                      env);
  };
  const IssuedCert second = ca_->issue("node-b");
  auto a = node("node-a", client_);
  auto b = node("node-b", second);
  for (auto* p : {a.get(), b.get()}) {
    const ProcessResult r = p->wait(3min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
  }
  expectExactlyOnce(dir_.file("samples"), 1);
  // No certificate: refused, named, and not retried for rdzv_timeout_s.
  auto bare = startAgent(AgentSpec{"node-c", "etcds://" + etcd.endpoints() + "/tls-2", "2", job,
                                   dir_.file("run-2"), {}, {}},
                         env);
  const ProcessResult r = bare->wait(40s);
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("elastic.etcd_cert_file"), std::string::npos) << r.err;
  // A key readable by others is bad input, before anything is joined.
  const IssuedCert loose = ca_->issue("node-d");
  fs::permissions(loose.keyFile, fs::perms::others_read, fs::perm_options::add);
  auto open = startAgent(AgentSpec{"node-d", rdzv + "-3", "2", job, dir_.file("run-3"), {},
                                   {"--set", "elastic.etcd_cert_file=" + loose.certFile, "--set",
                                    "elastic.etcd_key_file=" + loose.keyFile}},
                         env);
  const ProcessResult o = open->wait(40s);
  EXPECT_EQ(o.exitCode, 2) << o.describe();
  EXPECT_NE(o.err.find("elastic.etcd_key_file"), std::string::npos) << o.err;
}

}  // namespace
}  // namespace cohort::test
