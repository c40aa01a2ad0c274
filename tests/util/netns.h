#pragma once

// Test hosts with their own addresses: Linux network namespaces joined by
// veth pairs to a bridge in this namespace (which gets the subnet's .1).
// Made by the constructor, removed by the destructor (namespaces, links,
// bridge), so a test leaves nothing behind. Needs root and `ip`
// (iproute2): unavailable() says why not.

#include <string>
#include <vector>

namespace cohort::test {

class TestNetwork {
 public:
  // Empty when namespaces can be made here, else why not.
  static std::string unavailable();

  explicit TestNetwork(int hosts);
  ~TestNetwork();
  TestNetwork(const TestNetwork&) = delete;
  TestNetwork& operator=(const TestNetwork&) = delete;

  int size() const { return hosts_; }
  std::string address(int host) const;   // host's address
  std::string bridgeAddress() const;     // this namespace's address on the bridge
  // The command prefix that runs a program on `host`.
  std::vector<std::string> on(int host) const;
  // The same through nsenter: only the network changes (`ip netns exec`
  // also mounts a sysfs of its own, without /sys/fs/cgroup, which a slurmd
  // needs).
  std::vector<std::string> enter(int host) const;
  // Cuts host's link to the bridge: no packet passes, no connection is
  // reset.
  void cut(int host);

  // For the faults of util/netfault.h: host's namespace, its veth inside
  // it and the veth's other end on the bridge, and the subnet
  // ("10.X.Y.0/24").
  std::string namespaceName(int host) const { return ns(host); }
  std::string innerLink(int host) const;
  std::string bridgeLink(int host) const { return hostSide(host); }
  std::string subnet() const { return subnet_ + ".0/24"; }

 private:
  void teardown();
  std::string ns(int host) const;
  std::string hostSide(int host) const;
  int hosts_;
  std::string tag_;     // unique per test process
  std::string subnet_;  // "10.X.Y"
  std::vector<int> made_;
  bool bridge_ = false;
};

}  // namespace cohort::test
