#include "util/etcd.h"

#include "test_paths.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace cohort::test {

std::string etcdBinary() {
  // scripts/install-deps.sh's, or an installed one.
  for (const char* p : {COHORT_ETCD, "/usr/bin/etcd"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

EtcdCluster::EtcdCluster(int members, const std::string& host) {
  start(std::vector<EtcdHost>(static_cast<size_t>(members), EtcdHost{host, {}}));
}

EtcdCluster::EtcdCluster(const std::vector<EtcdHost>& hosts, std::optional<EtcdTls> tls,
                         std::vector<std::string> flags)
    : tls_(std::move(tls)), flags_(std::move(flags)) {
  start(hosts);
}

void EtcdCluster::start(const std::vector<EtcdHost>& hosts) {
  const std::string bin = etcdBinary();
  if (bin.empty()) throw std::runtime_error("etcd is not installed (scripts/install-deps.sh)");
  std::string initial;
  for (size_t i = 0; i < hosts.size(); ++i) {
    Member m;
    m.name = fmt::format("m{}", i);
    m.host = hosts[i];
    m.clientPort = freePort();
    m.peerPort = freePort();
    while (m.peerPort == m.clientPort) m.peerPort = freePort();
    initial += fmt::format("{}{}={}://{}:{}", i ? "," : "", m.name, scheme(), m.host.address, m.peerPort);
    members_.push_back(std::move(m));
  }
  for (auto& m : members_) {
    const std::string client = fmt::format("{}://{}:{}", scheme(), m.host.address, m.clientPort);
    const std::string peer = fmt::format("{}://{}:{}", scheme(), m.host.address, m.peerPort);
    m.argv = m.host.prefix;
    m.argv.insert(m.argv.end(),
                  {bin, "--name", m.name, "--data-dir", dir_.file(m.name), "--listen-client-urls", client,
                   "--advertise-client-urls", client, "--listen-peer-urls", peer,
                   "--initial-advertise-peer-urls", peer, "--initial-cluster", initial,
                   "--initial-cluster-state", "new", "--initial-cluster-token", "cohort-test",
                   "--heartbeat-interval", "100", "--election-timeout", "1000", "--log-level", "error"});
    if (tls_) {
      m.argv.insert(m.argv.end(),
                    {"--cert-file", tls_->certFile, "--key-file", tls_->keyFile, "--peer-cert-file",
                     tls_->certFile, "--peer-key-file", tls_->keyFile, "--peer-trusted-ca-file",
                     tls_->caFile, "--peer-client-cert-auth"});
      if (tls_->clientCertAuth) {
        m.argv.insert(m.argv.end(), {"--trusted-ca-file", tls_->caFile, "--client-cert-auth"});
      }
    }
    m.argv.insert(m.argv.end(), flags_.begin(), flags_.end());
    m.process = std::make_unique<Process>(m.argv);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (leader() < 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("etcd did not elect a leader within 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

EtcdCluster::~EtcdCluster() = default;  // each Process SIGKILLs and reaps its member

std::string EtcdCluster::endpoint(int i) const {
  const Member& m = members_.at(static_cast<size_t>(i));
  return fmt::format("{}:{}", m.host.address, m.clientPort);
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (int i = 0; i < size(); ++i) out += (i ? "," : "") + endpoint(i);
  return out;
}

int EtcdCluster::leader() const {
  // etcdctl endpoint status prints "..., <is leader>, ..." per endpoint.
  for (int i = 0; i < size(); ++i) {
    if (!members_[static_cast<size_t>(i)].process) continue;
    std::vector<std::string> argv = {"/usr/bin/etcdctl", "--endpoints", scheme() + "://" + endpoint(i),
                                     "--command-timeout=1s", "--dial-timeout=1s"};
    if (tls_) {
      argv.insert(argv.end(), {"--cacert", tls_->caFile, "--cert", tls_->clientCert, "--key", tls_->clientKey});
    }
    argv.insert(argv.end(), {"endpoint", "status", "-w", "simple"});
    const ProcessResult r = run(argv, {{"ETCDCTL_API", "3"}}, std::chrono::seconds(5));
    if (r.exitCode != 0) continue;
    // Columns: endpoint, id, version, db size, is leader, is learner, ...
    std::vector<std::string> cols;
    size_t start = 0;
    const std::string line = r.out.substr(0, r.out.find('\n'));
    for (size_t c; (c = line.find(", ", start)) != std::string::npos; start = c + 2) {
      cols.push_back(line.substr(start, c - start));
    }
    cols.push_back(line.substr(start));
    if (cols.size() > 4 && cols[4] == "true") return i;
  }
  return -1;
}

void EtcdCluster::kill(int i) { members_.at(static_cast<size_t>(i)).process.reset(); }

ProcessResult EtcdCluster::ctl(const std::vector<std::string>& args, const std::string& user) const {
  std::vector<std::string> argv = {"/usr/bin/etcdctl", "--endpoints", scheme() + "://" + endpoint(0),
                                   "--command-timeout=5s"};
  if (tls_) {
    argv.insert(argv.end(), {"--cacert", tls_->caFile, "--cert", tls_->clientCert, "--key", tls_->clientKey});
  }
  if (!user.empty()) argv.push_back("--user=" + user);
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, {{"ETCDCTL_API", "3"}}, std::chrono::seconds(20));
}

void EtcdCluster::restart(int i) {
  Member& m = members_.at(static_cast<size_t>(i));
  if (!m.process) m.process = std::make_unique<Process>(m.argv);
}

}  // namespace cohort::test
