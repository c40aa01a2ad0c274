#include "util/netfault.h"

#include "test_paths.h"

#include <fmt/format.h>

#include <fstream>
#include <stdexcept>

namespace cohort::test {
namespace {

using namespace std::chrono_literals;

constexpr const char* kTc = "/usr/sbin/tc";
constexpr const char* kNft = "/usr/sbin/nft";
constexpr int kRelayPort = 15999;
constexpr int kRelayMark = 0x2a;

void check(const std::vector<std::string>& argv, bool mustSucceed = true) {
  const ProcessResult r = run(argv, {}, 20s);
  if (mustSucceed && r.exitCode != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw std::runtime_error("failed: " + cmd + ": " + r.err);
  }
}

std::vector<std::string> with(std::vector<std::string> prefix, const std::vector<std::string>& argv) {
  prefix.insert(prefix.end(), argv.begin(), argv.end());
  return prefix;
}

}  // namespace

LinkFaults::LinkFaults(const TestNetwork& net) : net_(net), hosts_(static_cast<size_t>(net.size())) {}

LinkFaults::~LinkFaults() {
  for (int h = 0; h < net_.size(); ++h) {
    // The bridge's end lives in this namespace: its qdisc is ours to remove
    // (the namespace's side goes with the namespace).
    if (!hosts_[static_cast<size_t>(h)].rate.empty()) {
      check({kTc, "qdisc", "del", "dev", net_.bridgeLink(h), "root"}, false);
    }
  }
}

void LinkFaults::apply(int host) {
  const Host& h = hosts_.at(static_cast<size_t>(host));
  std::string filter;
  if (h.partitioned) filter += "    counter drop\n";
  if (h.lossPercent > 0) filter += fmt::format("    numgen random mod 100 < {} counter drop\n", h.lossPercent);
  std::string rules = fmt::format(
      "table inet cohort_faults\n"
      "delete table inet cohort_faults\n"
      "table inet cohort_faults {{\n"
      "  chain in {{ type filter hook input priority 0; policy accept;\n"
      "    iifname \"lo\" accept\n{0}  }}\n"
      "  chain out {{ type filter hook output priority 0; policy accept;\n"
      "    oifname \"lo\" accept\n{0}  }}\n",
      filter);
  if (h.relay) {
    rules += fmt::format(
        "  chain relay {{ type nat hook output priority -100; policy accept;\n"
        "    meta mark {} accept\n"
        "    ip daddr != {} accept\n"
        "    ip daddr {} accept\n"
        "    meta l4proto tcp redirect to :{}\n"
        "  }}\n",
        kRelayMark, net_.subnet(), net_.address(host), kRelayPort);
  }
  rules += "}\n";
  const std::string file = dir_.file(fmt::format("rules-{}.nft", host));
  writeText(file, rules);
  check(with(net_.on(host), {kNft, "-f", file}));
}

void LinkFaults::loss(int host, int percent) {
  if (percent < 0 || percent > 100) throw std::invalid_argument("loss: percent out of 0..100");
  hosts_.at(static_cast<size_t>(host)).lossPercent = percent;
  apply(host);
}

void LinkFaults::rate(int host, const std::string& rate) {
  Host& h = hosts_.at(static_cast<size_t>(host));
  const std::vector<std::pair<std::vector<std::string>, std::string>> ends = {
      {net_.on(host), net_.innerLink(host)}, {{}, net_.bridgeLink(host)}};
  for (const auto& [prefix, dev] : ends) {
    if (rate.empty()) {
      check(with(prefix, {kTc, "qdisc", "del", "dev", dev, "root"}), false);
    } else {
      // A burst of a few milliseconds of the rate, a queue of 400 ms.
      check(with(prefix, {kTc, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst",
                          "64kb", "latency", "400ms"}));
    }
  }
  h.rate = rate;
}

void LinkFaults::relay(int host) {
  Host& h = hosts_.at(static_cast<size_t>(host));
  if (h.relay) return;
  const std::string delayFile = dir_.file(fmt::format("delay-{}", host));
  writeText(delayFile, "0\n");
  h.relay = std::make_unique<Process>(with(
      net_.on(host), {COHORT_DELAY_RELAY, "--port", std::to_string(kRelayPort), "--mark",
                      std::to_string(kRelayMark), "--delay-file", delayFile}));
  if (!waitUntil([&] { return h.relay->stderrSoFar().find("listening on") != std::string::npos; }, 20s)) {
    throw std::runtime_error("the delay relay on host " + std::to_string(host) +
                             " did not start: " + h.relay->stderrSoFar());
  }
  apply(host);
}

void LinkFaults::latency(int host, int ms) {
  if (ms < 0) throw std::invalid_argument("latency: negative");
  relay(host);
  hosts_.at(static_cast<size_t>(host)).latencyMs = ms;
  // The relay reads it again within 50 ms.
  writeText(dir_.file(fmt::format("delay-{}", host)), std::to_string(ms) + "\n");
}

void LinkFaults::partition(int host) {
  hosts_.at(static_cast<size_t>(host)).partitioned = true;
  apply(host);
}

void LinkFaults::heal(int host) {
  hosts_.at(static_cast<size_t>(host)).partitioned = false;
  apply(host);
}

bool LinkFaults::partitioned(int host) const { return hosts_.at(static_cast<size_t>(host)).partitioned; }

void LinkFaults::clear() {
  for (int h = 0; h < net_.size(); ++h) {
    Host& s = hosts_[static_cast<size_t>(h)];
    if (s.latencyMs > 0) latency(h, 0);
    if (!s.rate.empty()) rate(h, "");
    if (s.lossPercent > 0 || s.partitioned) {
      s.lossPercent = 0;
      s.partitioned = false;
      apply(h);
    }
  }
}

int64_t LinkFaults::dropped(int host) const {
  const ProcessResult r = run(with(net_.on(host), {kNft, "list", "table", "inet", "cohort_faults"}), {}, 20s);
  int64_t total = 0;
  for (size_t at = 0; (at = r.out.find("packets ", at)) != std::string::npos;) {
    at += 8;
    total += std::stoll(r.out.substr(at, r.out.find(' ', at) - at));
  }
  return total;
}

int LinkFaults::relayed(int host) const {
  if (!hosts_.at(static_cast<size_t>(host)).relay) return 0;
  // Written by the relay every 50 ms (util/delay_relay.cc).
  std::ifstream in(dir_.file(fmt::format("delay-{}.relayed", host)));
  int n = 0;
  return (in >> n) ? n : 0;
}

std::string LinkFaults::describe(int host) const {
  const Host& h = hosts_.at(static_cast<size_t>(host));
  std::vector<std::string> parts;
  if (h.partitioned) parts.push_back("partitioned");
  if (h.lossPercent > 0) parts.push_back(fmt::format("loss {}%", h.lossPercent));
  if (!h.rate.empty()) parts.push_back("rate " + h.rate);
  if (h.latencyMs > 0) parts.push_back(fmt::format("latency +{} ms each way", h.latencyMs));
  return parts.empty() ? "clean" : fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace cohort::test
