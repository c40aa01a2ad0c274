// bench/ddp: data-parallel training throughput, cohort against PyTorch's own
// DDP, side by side on this machine.
//
// For ResNet-18 at 32 px (batch 32 per rank) and ResNet-50 at 64 px (batch 8
// per rank), at 1 and 2 ranks with 1 intra-op thread each, synthetic data,
// SGD with momentum:
//   cohort   `cohort run` of a synthetic job; images/s over the metrics
//            windows after the first (warm-up) one;
//   PyTorch  bench/peers/ddp.py (torchvision's model, gloo DDP, a fixed
//            batch), timed after the same warm-up.
// Prints images/s, cohort / PyTorch, weak-scaling efficiency
// (2-rank images/s / (2 x 1-rank images/s)), the ceiling of that efficiency
// on this machine (two 1-rank runs at once, no communication at all), and
// cohort's per-step breakdown (summary.json's phase_ms_per_step, rank 0).
//
//   cohort_bench_ddp [--only resnet18|resnet50] [--steps-scale F]

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "test_paths.h"
#include "util/jobs.h"
#include "util/process.h"

using namespace cohort;

namespace {

struct Config {
  std::string arch;
  int size, batch, warmup, steps;
};

// The rate over equal windows (the same number of steps and images each):
// images over seconds, i.e. the harmonic mean of the windows' rates, as the
// PyTorch peer measures (images over seconds after warm-up).
double overallRate(const std::vector<double>& rates) {
  double inverse = 0;
  for (double r : rates) inverse += 1 / r;
  return rates.empty() ? 0 : double(rates.size()) / inverse;
}

struct CohortResult {
  double imagesPerS = 0;
  nlohmann::json phases;
};

CohortResult readRun(const std::string& run);

// Writes the job; with `tag`, a second copy can run at the same time.
CohortResult runCohort(const test::TempDir& dir, const Config& c, int procs, const std::string& tag = "") {
  const std::string job = dir.file(fmt::format("{}-{}{}.yaml", c.arch, procs, tag));
  test::writeText(job, fmt::format(R"(name: bench-ddp
model: {{arch: {}, num_classes: 1000}}
data:
  train: {{kind: synthetic, size: {}, shape: [3, {}, {}]}}
  loader_threads: 1
distribution: {{threads_per_rank: 1}}
training:
  epochs: 1
  max_steps: {}
  batch_size: {}
  log_every: {}
  optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
checkpoint: {{enabled: false}}
output: {{progress: off, save_final: false}}
)", c.arch, (c.warmup + c.steps) * c.batch * procs, c.size, c.size, c.warmup + c.steps, c.batch,
                                   c.warmup));
  const std::string run = dir.file(fmt::format("run-{}-{}{}", c.arch, procs, tag));
  const auto r = test::run({COHORT_BIN, "run", job, "--procs", std::to_string(procs), "--run-dir", run},
                           {}, std::chrono::minutes(60));
  if (r.exitCode != 0) {
    std::cerr << "cohort run failed:\n" << r.describe() << "\n";
    std::exit(1);
  }
  return readRun(run);
}

CohortResult readRun(const std::string& run) {
  std::vector<double> windows;
  bool first = true;
  for (const auto& j : test::readJsonLines(run + "/metrics.jsonl")) {
    if (j["event"] != "train") continue;
    if (first) {
      first = false;
      continue;
    }
    windows.push_back(j["images_per_s"].get<double>());
  }
  std::ifstream in(run + "/summary.json");
  const auto s = nlohmann::json::parse(in);
  if (windows.empty()) {
    std::cerr << run << ": no metrics window after the warm-up one (too few steps)\n";
    std::exit(1);
  }
  return {overallRate(windows), s.value("phase_ms_per_step", nlohmann::json::object())};
}

nlohmann::json runPytorch(const Config& c, int procs) {
  const auto r = test::run({COHORT_PYTHON, std::string(COHORT_SOURCE_DIR) + "/bench/peers/ddp.py", "--arch",
                            c.arch, "--size", std::to_string(c.size), "--batch", std::to_string(c.batch),
                            "--world", std::to_string(procs), "--steps", std::to_string(c.steps),
                            "--warmup", std::to_string(c.warmup), "--port",
                            std::to_string(test::freePort())},
                           {}, std::chrono::minutes(60));
  if (r.exitCode != 0) {
    std::cerr << "PyTorch peer failed:\n" << r.describe() << "\n";
    std::exit(1);
  }
  return nlohmann::json::parse(r.out.substr(r.out.rfind("{\"peer\"")));
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;
  double scale = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--only") only = argv[i + 1];
    else if (a == "--steps-scale") scale = std::atof(argv[i + 1]);
    else {
      std::cerr << "usage: cohort_bench_ddp [--only resnet18|resnet50] [--steps-scale F]\n";
      return 2;
    }
  }
  std::vector<Config> configs = {{"resnet18", 32, 32, 10, 40}, {"resnet50", 64, 8, 3, 15}};
  test::TempDir dir;
  std::vector<nlohmann::json> lines;
  std::cout << fmt::format("{:<9} {:>5} {:>5} | {:>12} {:>12} {:>7} | {:>10} {:>10} {:>10}\n", "model", "px",
                           "ranks", "cohort img/s", "PyTorch", "ratio", "eff cohort", "eff PyTorch",
                           "no comm");
  for (Config c : configs) {
    if (!only.empty() && c.arch != only) continue;
    c.steps = std::max(3, static_cast<int>(c.steps * scale));
    double cohort1 = 0, torch1 = 0;
    for (int procs : {1, 2}) {
      const CohortResult co = runCohort(dir, c, procs);
      const nlohmann::json pt = runPytorch(c, procs);
      const double ptIps = pt["images_per_s"].get<double>();
      if (procs == 1) {
        cohort1 = co.imagesPerS;
        torch1 = ptIps;
      }
      double ceiling = 0;
      if (procs == 2) {
        // The ceiling: two 1-rank runs at once, no communication at all.
        CohortResult a, b;
        std::thread other([&] { b = runCohort(dir, c, 1, "-b"); });
        a = runCohort(dir, c, 1, "-a");
        other.join();
        ceiling = (a.imagesPerS + b.imagesPerS) / (2 * cohort1);
      }
      const double effC = co.imagesPerS / (procs * cohort1), effT = ptIps / (procs * torch1);
      std::cout << fmt::format("{:<9} {:>5} {:>5} | {:>12.1f} {:>12.1f} {:>6.2f}x | {:>9.1f}% {:>9.1f}% {:>9.1f}%\n",
                               c.arch, c.size, procs, co.imagesPerS, ptIps, co.imagesPerS / ptIps,
                               100 * effC, 100 * effT, 100 * ceiling);
      lines.push_back({{"bench", "ddp"}, {"arch", c.arch}, {"size", c.size}, {"batch", c.batch},
                       {"ranks", procs}, {"steps", c.steps}, {"cohort_images_per_s", co.imagesPerS},
                       {"pytorch_images_per_s", ptIps}, {"ratio", co.imagesPerS / ptIps},
                       {"cohort_efficiency", effC}, {"pytorch_efficiency", effT},
                       {"independent_efficiency", ceiling},
                       {"cohort_phase_ms", co.phases}, {"pytorch_phase_ms", pt["phase_ms"]}});
    }
  }
  std::cout << "\nper-step breakdown, ms (cohort rank 0; PyTorch rank 0: forward, backward incl. allreduce, optimizer)\n";
  for (const auto& l : lines) {
    const auto& p = l["cohort_phase_ms"];
    auto g = [&](const char* k) { return p.contains(k) ? p[k].get<double>() : 0.0; };
    const double total = g("data_wait") + g("forward") + g("backward") +
                         g("exposed_comm") + g("optimizer");
    std::cout << fmt::format(
        "{:<9} {} ranks: data wait {:.1f}, forward {:.1f}, backward {:.1f}, exposed comm {:.1f} "
        "({:.1f}% of the step), optimizer {:.1f} | PyTorch: forward {:.1f}, backward {:.1f}, optimizer {:.1f}\n",
        l["arch"].get<std::string>(), l["ranks"].get<int>(), g("data_wait"), g("forward"),
        g("backward"), g("exposed_comm"), total > 0 ? 100 * g("exposed_comm") / total : 0.0, g("optimizer"),
        l["pytorch_phase_ms"]["forward"].get<double>(), l["pytorch_phase_ms"]["backward"].get<double>(),
        l["pytorch_phase_ms"]["optimizer"].get<double>());
  }
  for (const auto& l : lines) std::cout << l.dump() << "\n";
  return 0;
}
