#include "elastic/elastic_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "util/etcd.h"
#include "util/jobs.h"
#include "util/netns.h"

namespace cohort::test {

namespace {

// The sections every elastic test job ends with: its output, a checkpoint
// every 100 steps and short elastic timings.
std::string elasticTail(const std::string& runsDir) {
  return fmt::format(R"(output:
  dir: {}
  progress: off
checkpoint:
  every_steps: 100
elastic:
  last_call_s: 1
  node_timeout_s: 3
)",
                     runsDir);
}

}  // namespace

std::string multiHostUnavailable() {
  if (std::string why = TestNetwork::unavailable(); !why.empty()) return why;
  if (etcdBinary().empty()) return "etcd is not installed (scripts/install-deps.sh)";
  return "";
}

std::string elasticJobYaml(const std::string& runsDir, int epochs, const std::string& extra) {
  return fmt::format(R"(name: elastic
model:
  arch: simple_cnn
  num_classes: 4
  width: 4
  hidden: 16
  batch_norm: false
  dropout: 0.0
data:
  train:
    kind: synthetic
    size: 4096
    shape: [1, 8, 8]
    seed: 3
  loader_threads: 1
distribution:
  nodes: 2
  procs_per_node: 1
  threads_per_rank: 1
  timeout_s: 60
  straggler_factor: 0
training:
  epochs: {}
  batch_size: 8
  seed: 7
  log_every: 50
  optimizer:
    name: sgd
    lr: 0.05
{}{})",
                     epochs, elasticTail(runsDir), extra);
}

std::string elasticGptJobYaml(const std::string& runsDir, const std::string& tokens, int layers, int epochs,
                              const std::string& distribution) {
  return fmt::format(R"(name: elastic-gpt
model: {{arch: gpt, n_layer: {}, n_head: 2, n_embd: 16, block_size: 16}}
data:
  train: {{kind: tokens, path: {}}}
  loader_threads: 1
distribution:
  threads_per_rank: 1
  timeout_s: 60
  straggler_factor: 0
{}
training:
  epochs: {}
  batch_size: 2
  seed: 7
  log_every: 20
  optimizer: {{name: adamw, lr: 0.003}}
{})",
                     layers, tokens, distribution, epochs, elasticTail(runsDir));
}

std::map<std::string, std::string> elasticEnv(const std::string& samplesDir, int slowMs) {
  std::map<std::string, std::string> env = {{"COHORT_TEST_SAMPLE_LOG", samplesDir}};
  if (slowMs > 0) env["COHORT_FAULT"] = fmt::format("slow{}@rank0:step0:always", slowMs);
  return env;
}

std::unique_ptr<Process> startAgent(const AgentSpec& a, const std::map<std::string, std::string>& env) {
  std::vector<std::string> argv = a.prefix;
  for (const std::string& s : std::vector<std::string>{cohortBin(), "agent", a.job, "--nnodes", a.nnodes,
                                                        "--rdzv", a.rdzv, "--node-id", a.node,
                                                        "--run-dir", a.runDir}) {
    argv.push_back(s);
  }
  argv.insert(argv.end(), a.extraArgs.begin(), a.extraArgs.end());
  return std::make_unique<Process>(argv, env);
}

SampleHistory readSampleLog(const std::string& dir) {
  struct Line {
    int round;
    int64_t step, epoch;  // epoch -1: "step applied"
    int64_t ms;
    std::vector<int64_t> ids;
  };
  std::vector<Line> lines;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind("samples-", 0) != 0) continue;
      std::ifstream in(dir + "/" + e->d_name);
      for (std::string text; std::getline(in, text);) {
        std::istringstream ss(text);
        Line l;
        if (!(ss >> l.round >> l.step >> l.epoch >> l.ms)) continue;
        for (int64_t id; ss >> id;) l.ids.push_back(id);
        lines.push_back(std::move(l));
      }
    }
    ::closedir(d);
  }
  std::map<int, int64_t> firstStep;  // round -> the first step it trained
  for (const Line& l : lines) {
    if (l.epoch < 0) continue;
    auto it = firstStep.find(l.round);
    if (it == firstStep.end() || l.step < it->second) firstStep[l.round] = l.step;
  }
  // Where the round after `round` took up (none: no later round).
  auto nextFirst = [&](int round) {
    auto next = firstStep.upper_bound(round);
    return next == firstStep.end() ? std::numeric_limits<int64_t>::max() : next->second;
  };
  SampleHistory h;
  for (const Line& l : lines) {
    const bool kept = l.step < nextFirst(l.round);  // in the state the job went on with
    if (l.epoch < 0) {
      if (kept) {
        h.stepsByRound[l.round].insert(l.step);
        AppliedStep& a = h.applied[l.step];
        a.round = l.round;
        a.unixMs = a.unixMs == 0 ? l.ms : std::min(a.unixMs, l.ms);
      }
      if (!kept) h.lost.insert(l.step);
      h.lastStep = std::max(h.lastStep, kept ? l.step : 0);
      continue;
    }
    if (kept) {
      for (int64_t id : l.ids) ++h.timesTrained[l.epoch][id];
      h.applied[l.step].samples += static_cast<int64_t>(l.ids.size());
    }
  }
  return h;
}

bool expectAllExitZero(const std::vector<std::unique_ptr<Process>>& agents, std::chrono::milliseconds limit) {
  bool all = true;
  for (const auto& a : agents) {
    const ProcessResult r = a->wait(limit);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    all = all && r.exitCode == 0;
  }
  return all;
}

std::string scrapeMetrics(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

std::vector<pid_t> childrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream in(fmt::format("/proc/{}/task/{}/children", pid, pid));
  for (pid_t p; in >> p;) {
    // Not the fork server the ranks are forked from (launch/fork_server.h).
    std::ifstream cmdline(fmt::format("/proc/{}/cmdline", p), std::ios::binary);
    std::string program, first;
    std::getline(cmdline, program, '\0');
    std::getline(cmdline, first, '\0');
    if (first != "--fork-server") out.push_back(p);
  }
  return out;
}

void expectExactlyOnce(const std::string& dir, int epochs, size_t samples) {
  const SampleHistory h = readSampleLog(dir);
  EXPECT_TRUE(h.redone().empty()) << "steps redone: " << h.redone().size() << ", e.g. "
                                  << (h.redone().empty() ? 0 : h.redone().front());
  ASSERT_EQ(static_cast<int>(h.timesTrained.size()), epochs);
  for (const auto& [epoch, times] : h.timesTrained) {
    EXPECT_EQ(times.size(), samples) << "epoch " << epoch << ": samples never trained on";
    int twice = 0;
    for (const auto& [id, n] : times) twice += n > 1;
    EXPECT_EQ(twice, 0) << "epoch " << epoch << ": samples trained on more than once";
  }
}

}  // namespace cohort::test
