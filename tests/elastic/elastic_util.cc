#include "elastic/elastic_util.h"

#include <dirent.h>
#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "util/jobs.h"

namespace cohort::test {

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
output:
  dir: {}
  progress: off
checkpoint:
  every_steps: 100
elastic:
  last_call_s: 1
  node_timeout_s: 3
{})",
                     epochs, runsDir, extra);
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

bool waitUntil(const std::function<bool()>& ready, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

std::vector<int64_t> SampleHistory::redone() const {
  std::map<int64_t, int> rounds;
  for (const auto& [round, steps] : stepsByRound) {
    for (int64_t s : steps) ++rounds[s];
  }
  std::vector<int64_t> out;
  for (const auto& [s, n] : rounds) {
    if (n > 1) out.push_back(s);
  }
  return out;
}

SampleHistory readSampleLog(const std::string& dir) {
  struct Line {
    int round;
    int64_t step, epoch;
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
        if (!(ss >> l.round >> l.step >> l.epoch)) continue;
        for (int64_t id; ss >> id;) l.ids.push_back(id);
        lines.push_back(std::move(l));
      }
    }
    ::closedir(d);
  }
  SampleHistory h;
  std::map<int64_t, int> lastRound;  // step -> the last round that applied it
  for (const Line& l : lines) {
    h.stepsByRound[l.round].insert(l.step);
    lastRound[l.step] = std::max(lastRound[l.step], l.round);
    h.lastStep = std::max(h.lastStep, l.step);
  }
  for (const Line& l : lines) {
    if (l.round != lastRound[l.step]) continue;
    for (int64_t id : l.ids) ++h.timesTrained[l.epoch][id];
  }
  return h;
}

std::vector<pid_t> childrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream in(fmt::format("/proc/{}/task/{}/children", pid, pid));
  for (pid_t p; in >> p;) out.push_back(p);
  return out;
}

}  // namespace cohort::test
