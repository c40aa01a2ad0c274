// bench/allreduce: the gradient exchange, raw c10d Gloo allreduce against
// cohort's gradient path of the same bytes.
//
// For world sizes 2 and 3 (real processes over loopback, one machine) and
// sizes 4 KB to 64 MB of float32, then for 4 ranks placed as 2 machines x 2
// on this host (COHORT_MACHINE_ID) and sizes 64 KB to 64 MB:
//   raw    ProcessGroupGloo::allreduce of one tensor, then wait;
//   cohort a module whose 4 parameters hold those bytes, under cohort's DDP
//          with one bucket, configured as the trainer runs it (the loss
//          carries 1 / world, so no division pass): backward (the hooks
//          launch the bucket's allreduce) + finishGradients(), minus the same
//          backward with gradient exchange off. What remains is what the
//          gradient path adds to a step: hooks, launch, allreduce, wait.
// On one machine cohort's path is shared memory; on the simulated 2 machines
// it is the hierarchical exchange (shared memory within a machine, Gloo
// between the two leaders), against raw Gloo among all 4 ranks. The
// machines share this host's cores and loopback, so that case shows what
// the hierarchy saves in Gloo traffic and steps, not a real network.
// Prints p50/p99 of rank 0 per size, algbw = bytes / p50 and busbw =
// algbw * 2(n-1)/n (as nccl-tests), and cohort's bandwidth as a ratio of
// raw's.
//
//   cohort_bench_allreduce [--budget-s S]     (parent: spawns the ranks)

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cohort/comm/comm.h"
#include "cohort/parallel/ddp.h"
#include "util/process.h"

using Clock = std::chrono::steady_clock;
using namespace cohort;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * double(v.size() - 1) + 0.5));
  return v[i];
}

const std::vector<int64_t> kSizes = {4 << 10, 16 << 10, 64 << 10, 256 << 10,
                                     1 << 20, 4 << 20,  16 << 20, 64 << 20};
// Fewer for the 4 ranks on 2 simulated machines, which take longer per size.
const std::vector<int64_t> kMachineSizes = {64 << 10, 1 << 20, 16 << 20, 64 << 20};

struct Params : torch::nn::Module {
  explicit Params(int64_t floats) {
    for (int i = 0; i < 4; ++i) {
      const int64_t n = floats / 4 + (i < floats % 4 ? 1 : 0);
      ps.push_back(register_parameter(fmt::format("p{}", i), torch::zeros({n})));
    }
  }
  std::vector<at::Tensor> ps;
};

// Runs `once` until `budget` seconds passed (at least `minIters`); every rank
// must run the same count, so rank 0 decides and broadcasts it.
int64_t agreeIterations(const comm::Comm& c, double perIter, double budget) {
  at::Tensor n = torch::tensor({static_cast<int64_t>(std::clamp(budget / std::max(perIter, 1e-6), 10.0, 400.0))});
  std::vector<at::Tensor> v{n};
  comm::broadcast(c, v, 0, "iteration count");
  return v[0].item<int64_t>();
}

int worker(double budget, int machines) {
  comm::CommOptions o;
  o.rank = std::atoi(std::getenv("RANK"));
  o.worldSize = std::atoi(std::getenv("WORLD_SIZE"));
  o.masterPort = std::atoi(std::getenv("MASTER_PORT"));
  o.hostStore = o.rank == 0;
  o.timeout = std::chrono::seconds(120);
  torch::set_num_threads(1);
  comm::Comm c = comm::connect(o);
  for (int64_t bytes : machines > 1 ? kMachineSizes : kSizes) {
    const int64_t floats = bytes / 4;
    // Raw c10d, and cohort's DDP path with the same backward without
    // exchange, interleaved so that both see the same machine; each timed
    // call starts together on every rank (a barrier).
    at::Tensor t = torch::ones({floats});
    auto module = std::make_shared<Params>(floats);
    parallel::DdpOptions dopts;
    dopts.bucketCapMb = double(bytes) / (1 << 20) + 1;
    dopts.divideGradients = false;  // as the trainer runs it: the loss carries 1 / world
    parallel::DistributedDataParallel d(module, c, dopts);
    auto rawOnce = [&] {
      std::vector<at::Tensor> v{t};
      comm::barrier(c, "align");
      const auto s = Clock::now();
      c.pg->allreduce(v)->wait();
      return since(s);
    };
    auto step = [&](bool sync) {
      d.zeroGrad();
      at::Tensor loss = module->ps[0].sum();
      for (size_t i = 1; i < module->ps.size(); ++i) loss = loss + module->ps[i].sum();
      d.setSyncGradients(sync);
      comm::barrier(c, "align");
      const auto s = Clock::now();
      loss.backward();
      d.finishGradients();
      return since(s);
    };
    for (int i = 0; i < 3; ++i) {
      rawOnce();
      step(true);
      step(false);
    }
    const int64_t iters = agreeIterations(c, rawOnce() + step(true) + step(false), budget);
    std::vector<double> raw, with, without;
    for (int64_t i = 0; i < iters; ++i) {
      raw.push_back(rawOnce());
      with.push_back(step(true));
      without.push_back(step(false));
    }
    const int64_t rawIters = iters, pathIters = iters;
    if (o.rank == 0) {
      const double rawP50 = percentile(raw, 0.5), rawP99 = percentile(raw, 0.99);
      // Per iteration: the step with exchange minus the same step without.
      std::vector<double> path;
      for (size_t i = 0; i < with.size(); ++i) path.push_back(std::max(1e-7, with[i] - without[i]));
      const double base = percentile(without, 0.5);
      const double pathP50 = percentile(path, 0.5);
      const double pathP99 = percentile(path, 0.99);
      const double n = o.worldSize;
      const double busFactor = 2 * (n - 1) / n;
      const parallel::DdpStats stats = d.stats();
      nlohmann::json j = {{"bench", "allreduce"},
                          {"world", o.worldSize},
                          {"machines", stats.machines},
                          {"exchange", parallel::exchangeName(stats.exchange)},
                          {"bytes", bytes},
                          {"raw_p50_ms", 1e3 * rawP50},
                          {"raw_p99_ms", 1e3 * rawP99},
                          {"raw_algbw_gbps", double(bytes) / rawP50 / 1e9},
                          {"raw_busbw_gbps", double(bytes) / rawP50 / 1e9 * busFactor},
                          {"cohort_p50_ms", 1e3 * pathP50},
                          {"cohort_p99_ms", 1e3 * pathP99},
                          {"cohort_algbw_gbps", double(bytes) / pathP50 / 1e9},
                          {"cohort_busbw_gbps", double(bytes) / pathP50 / 1e9 * busFactor},
                          {"backward_only_p50_ms", 1e3 * base},
                          {"ratio", rawP50 / pathP50},
                          {"iterations", {rawIters, pathIters}}};
      std::cout << j.dump() << std::endl;
    }
  }
  comm::barrier(c, "end");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double budget = 0.5;
  bool isWorker = false;
  int workerMachines = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--worker" && i + 1 < argc) {
      isWorker = true;
      workerMachines = std::atoi(argv[++i]);
    } else if (a == "--budget-s" && i + 1 < argc) {
      budget = std::atof(argv[++i]);
    } else {
      std::cerr << "usage: cohort_bench_allreduce [--budget-s S]\n";
      return 2;
    }
  }
  if (isWorker) return worker(budget, workerMachines);

  std::cout << fmt::format("{:>5} {:>9} | {:>9} {:>9} {:>8} {:>8} | {:>9} {:>9} {:>8} {:>8} | {:>6}\n",
                           "ranks", "bytes", "raw p50", "raw p99", "algbw", "busbw", "path p50",
                           "path p99", "algbw", "busbw", "ratio");
  std::cout << fmt::format("{:>5} {:>9} | {:>9} {:>9} {:>8} {:>8} | {:>9} {:>9} {:>8} {:>8} |\n", "", "",
                           "ms", "ms", "GB/s", "GB/s", "ms", "ms", "GB/s", "GB/s");
  std::vector<nlohmann::json> all;
  // (ranks, machines): the ranks of a machine are adjacent.
  for (const auto& [world, machines] : std::vector<std::pair<int, int>>{{2, 1}, {3, 1}, {4, 2}}) {
    const int port = test::freePort();
    std::vector<std::unique_ptr<test::Process>> ranks;
    for (int r = 0; r < world; ++r) {
      std::map<std::string, std::string> env{{"RANK", std::to_string(r)},
                                             {"WORLD_SIZE", std::to_string(world)},
                                             {"MASTER_PORT", std::to_string(port)}};
      if (machines > 1) env["COHORT_MACHINE_ID"] = fmt::format("bench-{}", r * machines / world);
      ranks.push_back(std::make_unique<test::Process>(
          std::vector<std::string>{argv[0], "--worker", std::to_string(machines), "--budget-s",
                                   std::to_string(budget)},
          env));
    }
    std::string out;
    for (int r = 0; r < world; ++r) {
      const auto res = ranks[static_cast<size_t>(r)]->wait(std::chrono::minutes(20));
      if (res.exitCode != 0) {
        std::cerr << "rank " << r << " of " << world << " failed:\n" << res.describe() << "\n";
        return 1;
      }
      if (r == 0) out = res.out;
    }
    size_t at = 0;
    while (at < out.size()) {
      const size_t end = out.find('\n', at);
      const std::string line = out.substr(at, end - at);
      at = end == std::string::npos ? out.size() : end + 1;
      if (line.empty() || line[0] != '{') continue;
      const auto j = nlohmann::json::parse(line);
      all.push_back(j);
      const int64_t b = j["bytes"].get<int64_t>();
      const std::string size = b >= (1 << 20) ? fmt::format("{} MB", b >> 20) : fmt::format("{} KB", b >> 10);
      const std::string who = machines > 1 ? fmt::format("{}x{}", machines, world / machines)
                                           : std::to_string(world);
      std::cout << fmt::format(
          "{:>5} {:>9} | {:>9.3f} {:>9.3f} {:>8.3f} {:>8.3f} | {:>9.3f} {:>9.3f} {:>8.3f} {:>8.3f} | {:>6.2f}\n",
          who, size, j["raw_p50_ms"].get<double>(), j["raw_p99_ms"].get<double>(),
          j["raw_algbw_gbps"].get<double>(), j["raw_busbw_gbps"].get<double>(),
          j["cohort_p50_ms"].get<double>(), j["cohort_p99_ms"].get<double>(),
          j["cohort_algbw_gbps"].get<double>(), j["cohort_busbw_gbps"].get<double>(),
          j["ratio"].get<double>());
    }
  }
  for (const auto& j : all) std::cout << j.dump() << "\n";
  return 0;
}
