#include "util/netns.h"

#include <fmt/format.h>
#include <unistd.h>

#include <stdexcept>

#include "util/process.h"

namespace cohort::test {
namespace {

constexpr const char* kIp = "/usr/sbin/ip";

void ip(const std::vector<std::string>& args, bool check = true) {
  std::vector<std::string> argv{kIp};
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult r = run(argv, {}, std::chrono::seconds(20));
  if (check && r.exitCode != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw std::runtime_error("failed: " + cmd + ": " + r.err);
  }
}

}  // namespace

std::string TestNetwork::unavailable() {
  if (::geteuid() != 0) return "network namespaces need root";
  if (::access(kIp, X_OK) != 0) return "ip (iproute2) is not installed";
  return "";
}

TestNetwork::TestNetwork(int hosts) : hosts_(hosts) {
  const int pid = static_cast<int>(::getpid());
  tag_ = std::to_string(pid % 100000);
  subnet_ = fmt::format("10.{}.{}", 200 + pid % 50, (pid / 50) % 250);
  try {
    ip({"link", "add", "cbr" + tag_, "type", "bridge"});
    bridge_ = true;
    ip({"addr", "add", bridgeAddress() + "/24", "dev", "cbr" + tag_});
    ip({"link", "set", "cbr" + tag_, "up"});
    for (int h = 0; h < hosts; ++h) {
      ip({"netns", "add", ns(h)});
      made_.push_back(h);
      const std::string inside = innerLink(h);
      ip({"link", "add", hostSide(h), "type", "veth", "peer", "name", inside});
      ip({"link", "set", inside, "netns", ns(h)});
      ip({"link", "set", hostSide(h), "master", "cbr" + tag_});
      ip({"link", "set", hostSide(h), "up"});
      ip({"-n", ns(h), "addr", "add", address(h) + "/24", "dev", inside});
      ip({"-n", ns(h), "link", "set", inside, "up"});
      ip({"-n", ns(h), "link", "set", "lo", "up"});
    }
  } catch (...) {
    teardown();
    throw;
  }
}

TestNetwork::~TestNetwork() { teardown(); }

void TestNetwork::teardown() {
  for (int h : made_) {
    ip({"link", "del", hostSide(h)}, false);
    ip({"netns", "del", ns(h)}, false);
  }
  made_.clear();
  if (bridge_) ip({"link", "del", "cbr" + tag_}, false);
  bridge_ = false;
}

std::string TestNetwork::ns(int host) const { return fmt::format("cohort-{}-{}", tag_, host); }
std::string TestNetwork::innerLink(int host) const { return fmt::format("cn{}x{}", tag_, host); }
std::string TestNetwork::hostSide(int host) const { return fmt::format("cv{}x{}", tag_, host); }
std::string TestNetwork::address(int host) const { return fmt::format("{}.{}", subnet_, host + 2); }
std::string TestNetwork::bridgeAddress() const { return subnet_ + ".1"; }

std::vector<std::string> TestNetwork::on(int host) const { return {kIp, "netns", "exec", ns(host)}; }

std::vector<std::string> TestNetwork::enter(int host) const {
  return {"/usr/bin/nsenter", "--net=/var/run/netns/" + ns(host)};
}

void TestNetwork::cut(int host) { ip({"link", "set", hostSide(host), "down"}); }

}  // namespace cohort::test
