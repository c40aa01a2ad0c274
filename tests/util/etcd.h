#pragma once

// etcd (Debian's etcd-server) for the elastic tests: one member or a
// cluster of three, on free ports of 127.0.0.1 (or on given addresses), with
// their data in a temporary directory. Every member is a child process,
// SIGKILLed and reaped by the destructor, so nothing outlives the test.

#include <memory>
#include <string>
#include <vector>

#include "util/process.h"

namespace cohort::test {

// Where etcd is; empty when it is not installed.
std::string etcdBinary();

class EtcdCluster {
 public:
  // `members` etcd processes on `host` forming one cluster; waits (at most
  // 60 s) until the cluster answers. Throws std::runtime_error otherwise.
  explicit EtcdCluster(int members = 1, const std::string& host = "127.0.0.1");
  ~EtcdCluster();

  // "HOST:PORT,..." of every member's client URL, for etcd://.
  std::string endpoints() const;
  std::string endpoint(int member) const;
  int size() const { return static_cast<int>(members_.size()); }
  // The member etcd calls leader (-1 when none answers).
  int leader() const;
  // SIGKILLs member `i` (it stays down).
  void kill(int i);

 private:
  struct Member {
    std::string name, host;
    int clientPort = 0, peerPort = 0;
    std::unique_ptr<Process> process;
  };
  TempDir dir_;
  std::vector<Member> members_;
};

}  // namespace cohort::test
