#pragma once

// etcd (Debian's etcd-server) for the elastic tests: one member or a
// cluster of three, on free ports of 127.0.0.1, on one given address, or
// one member on each of several test hosts (util/netns.h), with their data
// in a temporary directory; optionally over TLS with client certificates.
// Every member is a child process, SIGKILLed and reaped by the destructor,
// so nothing outlives the test.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "util/process.h"

namespace cohort::test {

// Where etcd is; empty when it is not installed.
std::string etcdBinary();

// Where one member runs: the address it listens on, and the command prefix
// that runs a program there (TestNetwork::on(host); empty: here).
struct EtcdHost {
  std::string address;
  std::vector<std::string> prefix;
};

// TLS on every member, for clients and peers alike: the members present
// `certFile`; with `clientCertAuth` they accept only clients with a
// certificate signed by `caFile` (peers always need one). The test's own
// etcdctl (leader(), ctl()) presents `clientCert`.
struct EtcdTls {
  std::string caFile, certFile, keyFile;
  std::string clientCert, clientKey;
  bool clientCertAuth = true;
};

class EtcdCluster {
 public:
  // `members` etcd processes on `host` forming one cluster; waits (at most
  // 60 s) until the cluster answers. Throws std::runtime_error otherwise.
  explicit EtcdCluster(int members = 1, const std::string& host = "127.0.0.1");
  // One member on each of `hosts`; `flags` go to every member.
  explicit EtcdCluster(const std::vector<EtcdHost>& hosts, std::optional<EtcdTls> tls = std::nullopt,
                       std::vector<std::string> flags = {});
  ~EtcdCluster();

  // "HOST:PORT,..." of every member's client URL, for etcd:// (etcds://
  // with TLS).
  std::string endpoints() const;
  std::string endpoint(int member) const;
  int size() const { return static_cast<int>(members_.size()); }
  // The member etcd calls leader (-1 when none answers).
  int leader() const;
  // SIGKILLs member `i` (it stays down until restart(i)).
  void kill(int i);
  // Starts member `i` again on its data: it rejoins the cluster.
  void restart(int i);
  // Runs `etcdctl ARGS...` against member 0 (with the test's client
  // certificate over TLS, and `--user` when given).
  ProcessResult ctl(const std::vector<std::string>& args, const std::string& user = "") const;
  bool running(int i) const { return members_.at(static_cast<size_t>(i)).process != nullptr; }

 private:
  struct Member {
    std::string name;
    EtcdHost host;
    int clientPort = 0, peerPort = 0;
    std::vector<std::string> argv;
    std::unique_ptr<Process> process;
  };
  void start(const std::vector<EtcdHost>& hosts);
  std::string scheme() const { return tls_ ? "https" : "http"; }
  TempDir dir_;
  std::optional<EtcdTls> tls_;
  std::vector<std::string> flags_;
  std::vector<Member> members_;
};

}  // namespace cohort::test
