// cohort_netsoak (scripts/soak.sh): an elastic job on three test hosts
// (network namespaces, util/netns.h) with a three-member etcd on three more,
// under random faults for --minutes: loss, a bandwidth limit and latency on
// every link; a node partitioned, or stopped with SIGSTOP, for longer than
// elastic.node_timeout_s; kill -9 of a rank or of an agent (a new agent
// takes the host); the etcd leader killed, and an etcd member partitioned.
// One fault at a time, each followed by clean training until the job is
// whole again. Then the job runs to its end, and the figures are printed
// (and written as JSON with --json): faults and recoveries by kind, time
// lost per fault, samples never trained and trained twice (both must be
// 0), steps redone, and whether the final model loads in PyTorch.
//
//   cohort_netsoak --minutes N [--seed S] [--faults K,K...] [--json FILE] [--keep DIR]
//
// --faults picks among degrade, partition, sigstop, kill-rank, kill-agent,
// etcd-leader and etcd-partition (default: all, weighted).
//
// Root only. Exit 0 when every figure that must hold does, 1 otherwise.

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "cohort/elastic/kv.h"
#include "elastic/elastic_util.h"
#include "test_paths.h"
#include "util/etcd.h"
#include "util/jobs.h"
#include "util/netfault.h"
#include "util/netns.h"
#include "util/process.h"

namespace cohort::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using nlohmann::json;
using SysClock = std::chrono::system_clock;

constexpr int kNodes = 3;  // hosts 0..2 run agents; hosts 3..5 run etcd
constexpr const char* kJobId = "soak";

// SIGINT or SIGTERM: the soak ends, its test hosts, etcd and agents
// removed (the destructors run).
std::atomic<int> gSignal{0};
extern "C" void onSignal(int sig) { gSignal = sig; }
struct Interrupted {};

int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SysClock::now().time_since_epoch()).count();
}

struct Options {
  double minutes = 30;
  unsigned seed = 1;
  std::string jsonPath, keep;
  std::vector<std::string> faults;  // empty: every kind
};

// One fault as injected: when, on what, and when the job was whole again.
struct Fault {
  std::string kind, target;
  int64_t startMs = 0, endMs = 0, recoveredMs = 0;  // end: healed, resumed, restarted
  bool recovered = false;
};

class Soak {
 public:
  Soak(const Options& o) : o_(o), rng_(o.seed), net_(2 * kNodes), faults_(net_) {}
  int run();

 private:
  struct Node {
    std::string id;
    std::unique_ptr<Process> agent;
  };
  void startAgent(int host);
  std::string jobYaml(int epochs) const;
  double calibrate();
  // The rendezvous record, or null when etcd does not answer now.
  json state();
  // Bytes of sample log written so far: grows while steps are trained.
  uintmax_t progress() const;
  // All kNodes nodes in one frozen round and training: waits at most
  // `limit`, restarting an agent that ended unexpectedly.
  bool whole(std::chrono::seconds limit);
  void tendAgents();
  // Waits `d`, draining the agents' output meanwhile (a full pipe would
  // stop them); throws Interrupted on SIGINT or SIGTERM.
  void idle(std::chrono::milliseconds d);
  Fault inject(const std::string& kind);
  void report(double cleanSamplesPerS);
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  std::chrono::milliseconds between(int loS, int hiS) {
    return std::chrono::milliseconds(std::uniform_int_distribution<int>(loS * 1000, hiS * 1000)(rng_));
  }

  Options o_;
  std::mt19937 rng_;
  TempDir dir_;
  TestNetwork net_;
  std::unique_ptr<EtcdCluster> etcd_;
  LinkFaults faults_;
  std::unique_ptr<elastic::Kv> kv_;
  std::string job_, samples_, runDir_;
  std::vector<Node> nodes_ = std::vector<Node>(kNodes);
  std::map<int, int> generation_;  // host -> agents started there
  std::vector<Fault> log_;
  int unexpectedExits_ = 0;
  int epochs_ = 1;
  int64_t startMs_ = 0;
  int exitCode_ = 0;
};

std::string Soak::jobYaml(int epochs) const {
  // Timings of a fast failure detector: lost after 4 s, a last call of 1 s;
  // rank failures are the soak's own doing: never give up on them.
  std::string y = elasticJobYaml(dir_.file("runs"), epochs, "  state_dir: " + dir_.file("shm") + "\n");
  const std::string from = "  timeout_s: 60\n";
  y.replace(y.find(from), from.size(), from + "  max_restarts: 1000000\n");
  const std::string nodeTimeout = "  node_timeout_s: 3\n";
  y.replace(y.find(nodeTimeout), nodeTimeout.size(), "  node_timeout_s: 4\n  below_min_timeout_s: 3600\n");
  return y;
}

void Soak::startAgent(int host) {
  const int g = generation_[host]++;
  Node& n = nodes_.at(static_cast<size_t>(host));
  n.id = g == 0 ? fmt::format("n{}", host) : fmt::format("n{}-{}", host, g);
  auto env = elasticEnv(samples_, 20);
  env["COHORT_STORE_TOKEN"] = "soak-token-0123456789abcdef0123";
  AgentSpec s{n.id, "etcd://" + etcd_->endpoints() + "/" + kJobId, "2:3", job_, runDir_, net_.on(host), {}};
  n.agent = test::startAgent(s, env);
}

json Soak::state() {
  try {
    const auto v = kv_->get(std::string("/cohort/") + kJobId + "/state");
    if (!v) return nullptr;
    return json::parse(v->value, nullptr, false);
  } catch (const std::exception&) {
    return nullptr;
  }
}

uintmax_t Soak::progress() const {
  uintmax_t total = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(samples_, ec)) total += fs::file_size(f.path(), ec);
  return total;
}

void Soak::idle(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  for (;;) {
    if (gSignal != 0) throw Interrupted{};
    for (Node& n : nodes_) {
      if (n.agent) (void)n.agent->stderrSoFar();
    }
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::milliseconds(0)) return;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(left, 200ms));
  }
}

void Soak::tendAgents() {
  for (int h = 0; h < kNodes; ++h) {
    Node& n = nodes_[static_cast<size_t>(h)];
    if (!n.agent || !n.agent->exited()) continue;
    const json s = state();
    if (s.is_object() && s.value("status", "") == "closed") continue;  // the job ended
    const ProcessResult r = n.agent->wait(std::chrono::hours(100));
    ++unexpectedExits_;
    const std::string err = r.err.substr(r.err.size() > 1500 ? r.err.size() - 1500 : 0);
    std::cout << fmt::format("  ! agent {} ended unexpectedly (exit {}, signal {}); a new one takes host {}\n{}\n",
                             n.id, r.exitCode, r.signal, h, err);
    startAgent(h);
  }
}

bool Soak::whole(std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int64_t seenRound = -1;
  uintmax_t atFreeze = 0;
  while (std::chrono::steady_clock::now() < until) {
    tendAgents();
    const json s = state();
    if (s.is_object() && s.value("status", "") == "closed") return true;
    if (s.is_object() && s.value("status", "") == "frozen" && s.value("members", json::array()).size() == kNodes) {
      const int64_t round = s.value("round", int64_t{-1});
      if (round != seenRound) {
        seenRound = round;
        atFreeze = progress();
      } else if (progress() > atFreeze + 4096) {  // a few dozen steps in this round
        return true;
      }
    } else {
      seenRound = -1;
    }
    idle(200ms);
  }
  return false;
}

double Soak::calibrate() {
  // A clean run of the same job, 2 epochs on 3 nodes: samples per second.
  const std::string saved = samples_;
  samples_ = dir_.file("calibration-samples");
  fs::create_directories(samples_);
  const std::string job = dir_.file("calibration.yaml");
  writeText(job, jobYaml(2));
  std::vector<std::unique_ptr<Process>> agents;
  auto env = elasticEnv(samples_, 20);
  env["COHORT_STORE_TOKEN"] = "soak-token-0123456789abcdef0123";
  for (int h = 0; h < kNodes; ++h) {
    AgentSpec s{fmt::format("c{}", h), "etcd://" + etcd_->endpoints() + "/calibration", "3", job,
                dir_.file("calibration-run"), net_.on(h), {}};
    agents.push_back(test::startAgent(s, env));
  }
  for (auto& a : agents) {
    const ProcessResult r = a->wait(15min);
    if (r.exitCode != 0) throw std::runtime_error("the calibration run failed: " + r.describe());
  }
  const SampleHistory h = readSampleLog(samples_);
  samples_ = saved;
  int64_t samples = 0;
  for (const auto& [step, a] : h.applied) samples += a.samples;
  const double seconds = (h.applied.rbegin()->second.unixMs - h.applied.begin()->second.unixMs) / 1000.0;
  return samples / std::max(1.0, seconds);
}

Fault Soak::inject(const std::string& kind) {
  Fault f;
  f.kind = kind;
  f.startMs = nowMs();
  if (kind == "degrade") {
    f.target = "every link: loss 1%, 50 Mbit/s, +5 ms each way";
    for (int h = 0; h < kNodes; ++h) {
      faults_.latency(h, 5);
      faults_.loss(h, 1);
      faults_.rate(h, "50mbit");
    }
    idle(between(20, 40));
    faults_.clear();
  } else if (kind == "partition") {
    const int h = pick(kNodes);
    f.target = nodes_[static_cast<size_t>(h)].id;
    faults_.partition(h);
    idle(between(6, 15));
    faults_.heal(h);
  } else if (kind == "sigstop") {
    const int h = pick(kNodes);
    Node& n = nodes_[static_cast<size_t>(h)];
    f.target = n.id;
    std::vector<pid_t> pids = {n.agent->pid()};
    for (pid_t r : childrenOf(n.agent->pid())) pids.push_back(r);
    for (pid_t p : pids) ::kill(p, SIGSTOP);
    idle(between(6, 15));
    for (auto it = pids.rbegin(); it != pids.rend(); ++it) ::kill(*it, SIGCONT);
  } else if (kind == "kill-rank") {
    const int h = pick(kNodes);
    Node& n = nodes_[static_cast<size_t>(h)];
    f.target = "the rank of " + n.id;
    for (pid_t r : childrenOf(n.agent->pid())) ::kill(r, SIGKILL);
  } else if (kind == "kill-agent") {
    const int h = pick(kNodes);
    Node& n = nodes_[static_cast<size_t>(h)];
    f.target = n.id;
    for (pid_t r : childrenOf(n.agent->pid())) ::kill(r, SIGKILL);
    n.agent->signal(SIGKILL);
    (void)n.agent->wait(std::chrono::hours(100));
    n.agent.reset();
    idle(between(5, 10));  // the others notice, then a new node arrives
    startAgent(h);
    f.target += " (then " + n.id + " joins)";
  } else if (kind == "etcd-leader") {
    const int leader = etcd_->leader();
    f.target = fmt::format("etcd member {}", leader);
    if (leader >= 0) {
      etcd_->kill(leader);
      idle(between(5, 10));
      etcd_->restart(leader);
    }
  } else if (kind == "etcd-partition") {
    const int leader = std::max(0, etcd_->leader());
    f.target = fmt::format("etcd member {} (the leader)", leader);
    faults_.partition(kNodes + leader);
    idle(between(10, 20));
    faults_.heal(kNodes + leader);
  }
  f.endMs = nowMs();
  f.recovered = whole(180s);
  f.recoveredMs = nowMs();
  return f;
}

int Soak::run() {
  // A line at a time, whatever stdout is: a soak is watched as it runs.
  std::cout << std::unitbuf;
  std::vector<EtcdHost> hosts;
  for (int h = kNodes; h < 2 * kNodes; ++h) hosts.push_back({net_.address(h), net_.on(h)});
  etcd_ = std::make_unique<EtcdCluster>(hosts);
  elastic::KvOptions ko;
  ko.retryFor = 3000ms;
  kv_ = elastic::connectKv("etcd://" + etcd_->endpoints(), ko);
  // Every connection between nodes through a relay from the start, so that
  // latency can come and go on them.
  for (int h = 0; h < kNodes; ++h) faults_.relay(h);
  fs::create_directories(dir_.file("shm"));
  std::cout << "calibrating: a clean run of 2 epochs on 3 nodes...\n";
  const double clean = calibrate();
  // Enough epochs to train for the whole soak at the clean rate: the faults
  // make it last longer.
  epochs_ = std::max(2, static_cast<int>(std::ceil(o_.minutes * 60 * clean / 4096)));
  std::cout << fmt::format("clean: {:.0f} samples/s; the job: {} epochs of 4096 samples\n", clean, epochs_);
  samples_ = dir_.file("samples");
  runDir_ = dir_.file("run");
  job_ = dir_.file("job.yaml");
  fs::create_directories(samples_);
  writeText(job_, jobYaml(epochs_));
  startMs_ = nowMs();
  for (int h = 0; h < kNodes; ++h) startAgent(h);
  if (!whole(120s)) {
    std::cerr << "the job never formed with 3 nodes\n";
    return 1;
  }
  const std::vector<std::pair<std::string, int>> kinds = {
      {"degrade", 2}, {"partition", 3}, {"sigstop", 3}, {"kill-rank", 2},
      {"kill-agent", 2}, {"etcd-leader", 2}, {"etcd-partition", 2}};
  std::vector<int> weights;
  for (const auto& k : kinds) {
    const bool chosen = o_.faults.empty() || std::find(o_.faults.begin(), o_.faults.end(), k.first) != o_.faults.end();
    weights.push_back(chosen ? k.second : 0);
  }
  std::discrete_distribution<int> which(weights.begin(), weights.end());
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.minutes * 60000));
  while (std::chrono::steady_clock::now() < end) {
    const json s = state();
    if (s.is_object() && s.value("status", "") == "closed") break;
    idle(between(5, 15));
    const std::string kind = kinds[static_cast<size_t>(which(rng_))].first;
    Fault f = inject(kind);
    std::cout << fmt::format("{:>6.1f} min  {:<15} {:<48} {}\n", (f.startMs - startMs_) / 60000.0, kind, f.target,
                             f.recovered ? fmt::format("whole again {:.1f} s after it ended",
                                                       (f.recoveredMs - f.endMs) / 1000.0)
                                         : "NOT whole again within 180 s");
    log_.push_back(f);
  }
  faults_.clear();
  std::cout << "faults over; the job runs to its end\n";
  int failedExits = 0;
  const auto giveUp = std::chrono::steady_clock::now() + 60min;
  auto allExited = [&] {
    for (const Node& n : nodes_) {
      if (!n.agent->exited()) return false;
    }
    return true;
  };
  while (!allExited() && std::chrono::steady_clock::now() < giveUp) idle(1s);
  for (int h = 0; h < kNodes; ++h) {
    if (!nodes_[static_cast<size_t>(h)].agent->exited()) {
      std::cerr << "agent " << nodes_[static_cast<size_t>(h)].id << " still running after an hour: killed\n";
      nodes_[static_cast<size_t>(h)].agent->signal(SIGKILL);
      ++failedExits;
    }
    const ProcessResult r = nodes_[static_cast<size_t>(h)].agent->wait(std::chrono::hours(100));
    if (r.exitCode != 0) {
      ++failedExits;
      std::cerr << fmt::format("agent {} exited {}:\n{}\n", nodes_[static_cast<size_t>(h)].id, r.exitCode,
                               r.err.substr(r.err.size() > 3000 ? r.err.size() - 3000 : 0));
    }
  }
  if (!o_.keep.empty()) fs::copy(dir_.path(), o_.keep, fs::copy_options::recursive);
  report(clean);
  return failedExits == 0 ? exitCode_ : 1;
}

// "8 932" (python's answer) -> "8 tensors, 932 values".
std::string loadedSize(const std::string& out) {
  std::istringstream in(out);
  int64_t tensors = 0, values = 0;
  in >> tensors >> values;
  return fmt::format("{} tensors, {} values", tensors, values);
}

void Soak::report(double clean) {
  const SampleHistory h = readSampleLog(samples_);
  int64_t neverTrained = 0, twice = 0;
  for (int e = 1; e <= epochs_; ++e) {
    const auto it = h.timesTrained.find(e);
    neverTrained += 4096 - (it == h.timesTrained.end() ? 0 : static_cast<int64_t>(it->second.size()));
    if (it == h.timesTrained.end()) continue;
    for (const auto& [id, n] : it->second) twice += n > 1;
  }
  // Per fault: the time it cost, as the wall time from its start until the
  // job was whole again less the samples trained meanwhile at the clean
  // rate; and the longest stretch without a step.
  json faults = json::array();
  struct Kind {
    int count = 0, recovered = 0;
    double lost = 0, maxLost = 0, recovery = 0, maxStall = 0;
  };
  std::map<std::string, Kind> kinds;
  for (const Fault& f : log_) {
    int64_t samples = 0, last = f.startMs, stallMs = 0;
    for (auto it = h.applied.begin(); it != h.applied.end(); ++it) {
      const AppliedStep& a = it->second;
      if (a.unixMs < f.startMs || a.unixMs > f.recoveredMs) continue;
      samples += a.samples;
      stallMs = std::max(stallMs, a.unixMs - last);
      last = a.unixMs;
    }
    const double lost = std::max(0.0, (f.recoveredMs - f.startMs) / 1000.0 - samples / clean);
    Kind& k = kinds[f.kind];
    ++k.count;
    k.recovered += f.recovered;
    k.lost += lost;
    k.maxLost = std::max(k.maxLost, lost);
    k.recovery += (f.recoveredMs - f.endMs) / 1000.0;
    k.maxStall = std::max(k.maxStall, stallMs / 1000.0);
    faults.push_back({{"kind", f.kind}, {"target", f.target}, {"at_min", (f.startMs - startMs_) / 60000.0},
                      {"lasted_s", (f.endMs - f.startMs) / 1000.0}, {"recovered", f.recovered},
                      {"whole_again_s", (f.recoveredMs - f.endMs) / 1000.0}, {"time_lost_s", lost},
                      {"longest_stall_s", stallMs / 1000.0}});
  }
  // The final model, read back by PyTorch.
  const std::string model = runDir_ + "/model/final.pt";
  const ProcessResult load = test::run({COHORT_PYTHON, "-c",
                                  "import sys, torch\n"
                                  "sd = torch.load(sys.argv[1])\n"
                                  "assert all(t.isfinite().all() for t in sd.values() if t.is_floating_point())\n"
                                  "print(len(sd), sum(t.numel() for t in sd.values()))",
                                  model},
                                 {}, 5min);
  const bool loads = load.exitCode == 0;
  std::error_code ec;
  int fenced = 0;
  for (const auto& e : fs::directory_iterator(runDir_ + "/fenced", ec)) fenced += e.is_regular_file();
  const double minutes = (nowMs() - startMs_) / 60000.0;
  int total = 0, recovered = 0;
  std::cout << fmt::format("\n{:<15} {:>6} {:>10} {:>14} {:>14} {:>16} {:>14}\n", "fault", "count", "recovered",
                           "time lost s", "max lost s", "whole again s", "max stall s");
  for (const auto& [name, k] : kinds) {
    total += k.count;
    recovered += k.recovered;
    std::cout << fmt::format("{:<15} {:>6} {:>10} {:>14.1f} {:>14.1f} {:>16.1f} {:>14.1f}\n", name, k.count,
                             k.recovered, k.lost / k.count, k.maxLost, k.recovery / k.count, k.maxStall);
  }
  const bool ok = neverTrained == 0 && twice == 0 && loads && recovered == total;
  std::cout << fmt::format(
      "\nsoak: {:.1f} min, seed {}, {} epochs, {} steps ({} redone after a failure), {} rounds\n"
      "faults injected: {}; recovered (the job whole again within 180 s): {}\n"
      "samples never trained: {} (must be 0); samples trained twice: {} (must be 0)\n"
      "nodes fenced out of the run: {}; agents that ended unexpectedly: {}\n"
      "final model loads in PyTorch: {}{}\n"
      "clean rate: {:.0f} samples/s (calibration, 3 nodes)\n{}\n",
      minutes, o_.seed, epochs_, h.lastStep, h.lost.size(), h.stepsByRound.size(), total, recovered, neverTrained,
      twice, fenced, unexpectedExits_, loads ? "yes" : "NO", loads ? " (" + loadedSize(load.out) + ")" : "\n" + load.err,
      clean, ok ? "PASS" : "FAIL");
  if (!o_.jsonPath.empty()) {
    json byKind = json::object();
    for (const auto& [name, k] : kinds) {
      byKind[name] = {{"count", k.count}, {"recovered", k.recovered}, {"mean_time_lost_s", k.lost / k.count},
                      {"max_time_lost_s", k.maxLost}, {"mean_whole_again_s", k.recovery / k.count},
                      {"max_stall_s", k.maxStall}};
    }
    const json out = {{"minutes", minutes}, {"seed", o_.seed}, {"epochs", epochs_}, {"steps", h.lastStep},
                      {"steps_redone", h.lost.size()}, {"rounds", h.stepsByRound.size()},
                      {"faults_injected", total}, {"recovered", recovered}, {"samples_never_trained", neverTrained},
                      {"samples_trained_twice", twice}, {"nodes_fenced", fenced},
                      {"unexpected_agent_exits", unexpectedExits_}, {"final_model_loads", loads},
                      {"clean_samples_per_s", clean}, {"by_kind", byKind}, {"faults", faults}, {"pass", ok}};
    std::ofstream(o_.jsonPath) << out.dump(2) << "\n";
  }
  if (!ok) exitCode_ = 1;
}

}  // namespace
}  // namespace cohort::test

int main(int argc, char** argv) {
  using cohort::test::Options;
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--minutes" && more) {
      o.minutes = std::atof(argv[++i]);
    } else if (a == "--seed" && more) {
      o.seed = static_cast<unsigned>(std::strtoul(argv[++i], nullptr, 10));
    } else if (a == "--json" && more) {
      o.jsonPath = argv[++i];
    } else if (a == "--keep" && more) {
      o.keep = argv[++i];
    } else if (a == "--faults" && more) {
      const std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        o.faults.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
      for (const auto& f : o.faults) {
        static const std::set<std::string> known = {"degrade", "partition", "sigstop", "kill-rank",
                                                     "kill-agent", "etcd-leader", "etcd-partition"};
        if (known.count(f) == 0) {
          std::cerr << "--faults: unknown fault '" << f << "'\n";
          return 2;
        }
      }
    } else {
      std::cerr << "usage: " << argv[0] << " --minutes N [--seed S] [--faults K,K...] [--json FILE] [--keep DIR]\n";
      return 2;
    }
  }
  if (!(o.minutes > 0)) {
    std::cerr << "--minutes must be a positive number\n";
    return 2;
  }
  if (const std::string why = cohort::test::TestNetwork::unavailable(); !why.empty()) {
    std::cerr << "the soak needs test hosts in network namespaces: " << why << "\n";
    return 2;
  }
  if (cohort::test::etcdBinary().empty() || ::access("/usr/sbin/nft", X_OK) != 0) {
    std::cerr << "the soak needs etcd and nftables (scripts/install-deps.sh)\n";
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = cohort::test::onSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  try {
    cohort::test::Soak soak(o);
    return soak.run();
  } catch (const cohort::test::Interrupted&) {
    std::cerr << "soak: interrupted; test hosts, etcd and agents removed\n";
    return 130;
  } catch (const std::exception& e) {
    std::cerr << "soak: " << e.what() << "\n";
    return 1;
  }
}
