// bench/ddp: data-parallel training throughput, cohort against PyTorch's own
// DDP, side by side on this machine.
//
// For ResNet-18 at 32 px (batch 32 per rank) and ResNet-50 at 64 px (batch 8
// per rank), synthetic data, SGD with momentum:
//   cohort   `cohort run` of a synthetic job; images/s over the metrics
//            windows after the first (warm-up) one;
//   PyTorch  bench/peers/ddp.py (torchvision's model, gloo DDP, a fixed
//            batch, in the memory format cohort's run of the pair chose),
//            timed after the same warm-up.
// First the CPU (model and the instruction sets kernels are chosen by), then
// one rank per model at 1 and at 2 intra-op threads, cohort and PyTorch
// alternating --repeat times (the ratio of the mean rates, and the lowest
// and highest ratio of one pair), then 2 ranks x 1 thread (alternating as
// often) with weak-scaling efficiency (2-rank images/s / (2 x 1-rank images/s)) and its ceiling on
// this machine (two 1-rank runs at once, no communication at all), then
// cohort's per-step breakdown (summary.json's phase_ms_per_step, rank 0).
//
//   cohort_bench_ddp [--only resnet18|resnet50] [--steps-scale F] [--repeat N]
//                    [--isa native|avx2|env] [--zero S] [--allocator glibc|tcmalloc|jemalloc]
// --allocator starts both sides with that allocator preloaded (glibc: none,
// and cohort on glibc's defaults too: compute.allocator: system) and the
// peer with OMP_NUM_THREADS at the run's threads (bench/launch_env.py, as
// PyTorch's CPU launcher would; cohort's ranks set theirs from
// threads_per_rank); without it each side starts as by default, cohort with
// compute.allocator: keep.
// Either way a pair whose sides report another allocator or other thread
// counts stops the benchmark (bench/launch_env.h).
// --zero S also runs cohort's 2 ranks at distribution.zero S, right after
// the ceiling's runs, and prints its efficiency against that ceiling.
// --isa (bench/launch_env.h applyIsa): native (the default) runs each
// library's own choice of kernels, the variables that would hold them
// removed; avx2 runs both sides as on a CPU without AVX-512: LibTorch's
// kernels (ATEN_CPU_CAPABILITY), oneDNN's (ONEDNN_MAX_CPU_ISA) and
// OpenBLAS's (OPENBLAS_CORETYPE) held to AVX2; env keeps the environment's.

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "cohort/core/cpu.h"
#include "launch_env.h"
#include "run_rate.h"
#include "test_paths.h"
#include "util/jobs.h"
#include "util/process.h"

using namespace cohort;

namespace {

struct Config {
  std::string arch;
  int size, batch, warmup, steps;
  int threads = 1;
  int zero = 0;  // distribution.zero
};

struct CohortResult {
  double imagesPerS = 0;
  nlohmann::json phases;
  nlohmann::json compute;  // summary.json's "compute": what the rank chose
};

CohortResult readRun(const std::string& run);

std::atomic<int> runs{0};  // each run its own directory
std::string allocator;     // --allocator: both sides' (bench/launch_env.py); "" none

// compute.allocator of cohort's side: glibc's defaults, as the peer's, when
// both run on glibc by --allocator glibc; cohort's default otherwise (a
// preloaded allocator ignores it).
std::string cohortAllocatorPolicy() { return allocator == "glibc" ? "system" : "keep"; }

// Writes the job; with `tag`, a second copy can run at the same time.
CohortResult runCohort(const test::TempDir& dir, const Config& c, int procs, const std::string& tag = "") {
  const std::string job = dir.file(fmt::format("{}-{}x{}{}.yaml", c.arch, procs, c.threads, tag));
  test::writeText(job, fmt::format(R"(name: bench-ddp
model: {{arch: {}, num_classes: 1000}}
data:
  train: {{kind: synthetic, size: {}, shape: [3, {}, {}]}}
  loader_threads: 1
distribution: {{threads_per_rank: {}, zero: {}}}
training:
  epochs: 1
  max_steps: {}
  batch_size: {}
  log_every: {}
  optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
checkpoint: {{enabled: false}}
output: {{progress: off, save_final: false}}
compute: {{allocator: {}}}
)", c.arch, (c.warmup + c.steps) * c.batch * procs, c.size, c.size, c.threads,
                                   c.zero, c.warmup + c.steps, c.batch,
                                   c.warmup, cohortAllocatorPolicy()));
  const std::string run = dir.file(fmt::format("run-{}-{}x{}{}-{}", c.arch, procs, c.threads, tag, runs++));
  const auto r = test::run({COHORT_BIN, "run", job, "--procs", std::to_string(procs), "--run-dir", run},
                           bench::launchEnvironment(allocator, c.threads), std::chrono::minutes(60));
  if (r.exitCode != 0) {
    std::cerr << "cohort run failed:\n" << r.describe() << "\n";
    std::exit(1);
  }
  return readRun(run);
}

CohortResult readRun(const std::string& run) {
  const std::vector<double> windows = bench::windowRates(run, "images_per_s");
  std::ifstream in(run + "/summary.json");
  const auto s = nlohmann::json::parse(in);
  if (windows.empty()) {
    std::cerr << run << ": no metrics window after the warm-up one (too few steps)\n";
    std::exit(1);
  }
  return {bench::overallRate(windows), s.value("phase_ms_per_step", nlohmann::json::object()),
          s.value("compute", nlohmann::json::object())};
}

// `layout`: the memory format cohort's run of the pair chose (its
// model.memory_format: auto), so that both sides convolve in one layout.
nlohmann::json runPytorch(const Config& c, int procs, const std::string& layout) {
  const auto r = test::run({COHORT_PYTHON, std::string(COHORT_SOURCE_DIR) + "/bench/peers/ddp.py", "--arch",
                            c.arch, "--size", std::to_string(c.size), "--batch", std::to_string(c.batch),
                            "--world", std::to_string(procs), "--steps", std::to_string(c.steps),
                            "--warmup", std::to_string(c.warmup), "--threads",
                            std::to_string(c.threads), "--memory-format",
                            layout == "channels_last" ? layout : "contiguous", "--port",
                            std::to_string(test::freePort())},
                           bench::launchEnvironment(allocator, c.threads), std::chrono::minutes(60));
  if (r.exitCode != 0) {
    std::cerr << "PyTorch peer failed:\n" << r.describe() << "\n";
    std::exit(1);
  }
  return nlohmann::json::parse(r.out.substr(r.out.rfind("{\"peer\"")));
}

struct Row {
  Config c;
  int procs;
  double cohortIps, torchIps, ratioMin, ratioMax;
  CohortResult cohort;
  nlohmann::json torch;
};

nlohmann::json rowJson(const Row& r) {
  return {{"bench", "ddp"},
          {"arch", r.c.arch},
          {"size", r.c.size},
          {"batch", r.c.batch},
          {"ranks", r.procs},
          {"threads", r.c.threads},
          {"steps", r.c.steps},
          {"cohort_images_per_s", r.cohortIps},
          {"pytorch_images_per_s", r.torchIps},
          {"ratio", r.cohortIps / r.torchIps},
          {"ratio_min", r.ratioMin},
          {"ratio_max", r.ratioMax},
          {"cohort_memory_format", r.cohort.compute.value("memory_format", "")},
          {"cohort_conv_products", r.cohort.compute.value("conv_products", "")},
          {"pytorch_memory_format", r.torch.value("memory_format", "")},
          {"cohort_kernels", r.cohort.compute.value("kernels", "")},
          {"cohort_phase_ms", r.cohort.phases},
          {"pytorch_phase_ms", r.torch["phase_ms"]},
          {"allocator", allocator.empty() ? "each side's default" : allocator},
          {"cohort_malloc", r.cohort.compute.value("malloc", "")},
          {"pytorch_launch", r.torch.value("launch", nlohmann::json())}};
}

// cohort and PyTorch alternately, `repeat` times: the summed rates' ratio,
// and the extremes of one pair's.
Row sideBySide(const test::TempDir& dir, const Config& c, int procs, int repeat) {
  Row r{c, procs, 0, 0, 1e300, 0, {}, {}};
  for (int k = 0; k < repeat; ++k) {
    CohortResult co = runCohort(dir, c, procs);
    const std::string layout = co.compute.value("memory_format", "");
    nlohmann::json pt = runPytorch(c, procs, layout);
    const std::string what = fmt::format("{} {} ranks x {} threads", c.arch, procs, c.threads);
    bench::requireSameLaunch(co.compute, pt.value("launch", nlohmann::json()), what);
    if (pt.value("memory_format", "") != (layout == "channels_last" ? layout : "contiguous")) {
      throw std::runtime_error(what + ": the peer ran in " + pt.value("memory_format", "?") + ", cohort in " + layout);
    }
    const double ptIps = pt["images_per_s"].get<double>();
    r.cohortIps += co.imagesPerS / repeat;
    r.torchIps += ptIps / repeat;
    r.ratioMin = std::min(r.ratioMin, co.imagesPerS / ptIps);
    r.ratioMax = std::max(r.ratioMax, co.imagesPerS / ptIps);
    r.cohort = std::move(co);
    r.torch = std::move(pt);
  }
  return r;
}

}  // namespace

int runBench(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return runBench(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}

int runBench(int argc, char** argv) {
  std::string only;
  double scale = 1;
  int repeat = 2;
  int zero = 0;
  std::string isa = "native";
  // Every option takes a value: a lone or unknown one prints the usage.
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--only" && (v == "resnet18" || v == "resnet50")) {
      only = v;
    } else if (a == "--steps-scale" && std::atof(v.c_str()) > 0) {
      scale = std::atof(v.c_str());
    } else if (a == "--repeat" && !v.empty()) {
      repeat = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--zero" && !v.empty()) {
      zero = std::atoi(v.c_str());
    } else if (a == "--allocator" && !v.empty()) {
      allocator = v;
    } else if (a == "--isa" && !v.empty()) {
      isa = v;
    } else {
      std::cerr << "usage: cohort_bench_ddp [--only resnet18|resnet50] [--steps-scale F] "
                   "[--repeat N] [--isa native|avx2|env] [--zero S] [--allocator glibc|tcmalloc|jemalloc]\n";
      return 2;
    }
  }
  std::string isaLine;
  try {
    isaLine = bench::applyIsa(isa);  // inherited by both sides' processes
  } catch (const std::invalid_argument& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  const CpuInfo cpu = cpuInfo();
  std::cout << "cpu: " << describe(cpu) << "\n" << isaLine << "\n\n";
  std::vector<Config> configs = {{"resnet18", 32, 32, 10, 40}, {"resnet50", 64, 8, 3, 15}};
  test::TempDir dir;
  std::vector<Row> rows;
  std::cout << fmt::format("{:<9} {:>3} {:>5} {:>7} | {:>12} {:>9} {:>7} {:>13} | {:>10} {:>11} {:>9} {:>6}\n",
                           "model", "px", "ranks", "threads", "cohort img/s", "PyTorch", "ratio",
                           "(one pair)", "eff cohort", "eff PyTorch", "no comm", "of it");
  auto print = [](const Row& r, double effC, double effT, double ceiling) {
    std::cout << fmt::format(
        "{:<9} {:>3} {:>5} {:>7} | {:>12.1f} {:>9.1f} {:>6.2f}x {:>5.2f}-{:<5.2f}x |", r.c.arch,
        r.c.size, r.procs, r.c.threads, r.cohortIps, r.torchIps, r.cohortIps / r.torchIps,
        r.ratioMin, r.ratioMax);
    if (r.procs > 1) {
      std::cout << fmt::format(" {:>9.1f}% {:>10.1f}% {:>8.1f}% {:>6.3f}", 100 * effC, 100 * effT,
                               100 * ceiling, effC / ceiling);
    }
    std::cout << std::endl;
  };
  // One rank first: no communication, only how a rank drives LibTorch.
  std::vector<nlohmann::json> lines;
  for (int threads : {1, 2}) {
    for (Config c : configs) {
      if (!only.empty() && c.arch != only) continue;
      c.steps = std::max(3, static_cast<int>(c.steps * scale));
      c.threads = threads;
      rows.push_back(sideBySide(dir, c, 1, repeat));
      print(rows.back(), 0, 0, 0);
      lines.push_back(rowJson(rows.back()));
    }
  }
  for (Config c : configs) {
    if (!only.empty() && c.arch != only) continue;
    c.steps = std::max(3, static_cast<int>(c.steps * scale));
    const Row* one = nullptr;
    for (const Row& r : rows) {
      if (r.c.arch == c.arch && r.c.threads == 1) one = &r;
    }
    Row two = sideBySide(dir, c, 2, repeat);
    // The ceiling: two 1-rank runs at once, no communication at all.
    std::atomic<int> tag{0};
    const auto [a, b] = bench::together([&] { return runCohort(dir, c, 1, fmt::format("-{}", tag++)); });
    const double ceiling = (a.imagesPerS + b.imagesPerS) / (2 * one->cohortIps);
    const double effC = two.cohortIps / (2 * one->cohortIps);
    const double effT = two.torchIps / (2 * one->torchIps);
    print(two, effC, effT, ceiling);
    nlohmann::json j = rowJson(two);
    j["cohort_efficiency"] = effC;
    j["pytorch_efficiency"] = effT;
    j["independent_efficiency"] = ceiling;
    j["efficiency_of_ceiling"] = effC / ceiling;
    if (zero > 0) {
      Config z = c;
      z.zero = zero;
      const CohortResult sharded = runCohort(dir, z, 2, fmt::format("-zero{}", zero));
      const double effZ = sharded.imagesPerS / (2 * one->cohortIps);
      std::cout << fmt::format("{:<9} cohort 2 ranks at ZeRO stage {}: {:.1f} img/s, efficiency {:.1f}% "
                               "= {:.3f} of the ceiling (stage 0: {:.3f})\n",
                               c.arch, zero, sharded.imagesPerS, 100 * effZ, effZ / ceiling,
                               effC / ceiling);
      j["zero_stage"] = zero;
      j["zero_images_per_s"] = sharded.imagesPerS;
      j["zero_efficiency"] = effZ;
      j["zero_phase_ms"] = sharded.phases;
    }
    lines.push_back(j);
  }
  std::cout << "\nper-step breakdown, ms (cohort rank 0; PyTorch rank 0: forward, backward incl. "
               "allreduce, optimizer)\n";
  for (const auto& l : lines) {
    const auto& p = l["cohort_phase_ms"];
    auto g = [&](const char* k) { return p.contains(k) ? p[k].get<double>() : 0.0; };
    const double total = g("data_wait") + g("forward") + g("backward") + g("exposed_comm") + g("optimizer");
    std::cout << fmt::format(
        "{:<9} {} ranks x {} threads ({}): data wait {:.1f}, forward {:.1f}, backward {:.1f}, exposed comm "
        "{:.1f} ({:.1f}% of the step), optimizer {:.1f} | PyTorch: forward {:.1f}, backward {:.1f}, "
        "optimizer {:.1f}\n  unfolded convolutions: {}\n",
        l["arch"].get<std::string>(), l["ranks"].get<int>(), l["threads"].get<int>(),
        l["cohort_memory_format"].get<std::string>(), g("data_wait"), g("forward"), g("backward"),
        g("exposed_comm"), total > 0 ? 100 * g("exposed_comm") / total : 0.0, g("optimizer"),
        l["pytorch_phase_ms"]["forward"].get<double>(), l["pytorch_phase_ms"]["backward"].get<double>(),
        l["pytorch_phase_ms"]["optimizer"].get<double>(), l.value("cohort_conv_products", "-"));
  }
  std::cout << nlohmann::json{{"bench", "cpu"}, {"model", cpu.model}, {"features", cpu.features},
                              {"isa", isa}, {"isa_line", isaLine}}
                   .dump()
            << "\n";
  for (const auto& l : lines) std::cout << l.dump() << "\n";
  return 0;
}
