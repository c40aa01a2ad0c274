// bench/gpt: GPT training throughput, cohort against PyTorch's own DDP, side
// by side on this machine.
//
// examples/gpt-kjv.yaml's model (4 layers of 4 heads, 128 wide, block 256,
// batch 16 windows per rank, AdamW) at each training.precision:
//   cohort   `cohort run` of a job on a token dataset this bench makes
//            (deterministic English-like text, `cohort data tokenize`);
//            tokens/s over the metrics windows after the first (warm-up)
//            one;
//   PyTorch  bench/peers/gpt.py ddp (the same architecture, gloo DDP, a
//            fixed random batch, autocast to bfloat16 for bf16, the loss in
//            float32 as cohort's), timed after the same warm-up.
// First the CPU (bf16 runs native kernels only with avx512_bf16 or
// amx_bf16), then per precision one rank x 1 thread, cohort and PyTorch
// alternating --repeat times (the ratio of the mean rates, and the lowest
// and highest ratio of one pair), then 2 ranks x 1 thread, alternating as
// often, with weak-scaling efficiency (2-rank tokens/s / (2 x 1-rank
// tokens/s)) and its ceiling on this machine (two 1-rank runs at once, no
// communication at all); then each side's
// bf16/fp32 speed-up, and cohort's per-step breakdown (summary.json's
// phase_ms_per_step, rank 0) beside PyTorch's.
//
//   cohort_bench_gpt [--repeat N] [--steps-scale F] [--only fp32|bf16]
//                    [--allocator glibc|tcmalloc|jemalloc] [--isa native|avx2|env]
// --isa as cohort_bench_ddp's (bench/launch_env.h applyIsa): each
// library's own kernels by default.
// --allocator starts both sides with that allocator preloaded (glibc: none,
// and cohort on glibc's defaults too: compute.allocator: system) and the
// peer with OMP_NUM_THREADS at the run's threads (bench/launch_env.py;
// cohort's ranks set theirs from threads_per_rank); without it each side
// starts as by default, cohort with compute.allocator: keep. Either way a pair whose sides report
// another allocator or other thread counts stops it (bench/launch_env.h).

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
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

// examples/gpt-kjv.yaml's model and per-rank batch.
constexpr int kLayers = 4;
constexpr int kHeads = 4;
constexpr int kEmbd = 128;
constexpr int kBlock = 256;
constexpr int kBatch = 16;
constexpr size_t kTextBytes = 2'000'000;

// A run that failed: main reports it after the temporary directory is gone.
struct BenchFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Config {
  std::string precision;
  int warmup = 5, steps = 30;
  int threads = 1;
};

struct Data {
  std::string train;  // the token dataset's training split
  int vocab = 0;
};

// What the text says does not matter for throughput; a fixed generator
// (mt19937's sequence is the same everywhere) keeps runs comparable.
Data makeData(const test::TempDir& dir) {
  static const std::vector<std::string> kWords = {
      "the", "and", "of", "to", "in", "that", "he", "shall", "unto", "for", "his", "a", "they",
      "be", "is", "him", "not", "them", "with", "all", "it", "was", "thou", "which", "my", "me",
      "said", "but", "ye", "their", "have", "will", "thee", "from", "as", "are", "when", "this",
      "out", "were", "upon", "man", "by", "king", "there", "went", "people", "house", "land", "day",
      "came", "son", "before", "hand", "children", "great", "father", "water", "light", "earth"};
  std::mt19937 rng(20240611);
  std::string text;
  text.reserve(kTextBytes + 64);
  bool capital = true;
  while (text.size() < kTextBytes) {
    std::string w = kWords[rng() % kWords.size()];
    if (capital) w[0] = static_cast<char>(w[0] - 'a' + 'A');
    text += w;
    capital = rng() % 10 == 0;
    if (capital) {
      text += rng() % 4 == 0 ? ".\n" : ". ";
    } else {
      text += rng() % 8 == 0 ? ", " : " ";
    }
  }
  const std::string file = dir.file("text.txt");
  test::writeText(file, text);
  const std::string tok = dir.file("tok");
  const auto r = test::run({COHORT_BIN, "data", "tokenize", file, tok, "--no-progress"}, {},
                           std::chrono::minutes(10));
  if (r.exitCode != 0) throw BenchFailure("cohort data tokenize failed:\n" + r.describe());
  std::ifstream in(tok + "/train/dataset.json");
  const auto manifest = nlohmann::json::parse(in);
  return {tok + "/train", manifest.at("vocab_size").get<int>()};
}

struct CohortResult {
  double tokensPerS = 0;
  nlohmann::json phases;
  nlohmann::json compute;  // summary.json's "compute": what the rank chose
  nlohmann::json utilization;  // summary.json's "utilization": FLOPs per sample, the GEMM ceiling
};

// cohort's model FLOPs utilization per rank at `tokensPerS` over `procs`
// ranks (summary.json's count and ceiling); 0 when not known.
double mfuOf(const CohortResult& r, double tokensPerS, int procs) {
  const double perSample = r.utilization.value("model_flops_per_sample", 0.0);
  const auto ceiling = r.utilization.value("gemm_ceiling", nlohmann::json());
  if (perSample <= 0 || !ceiling.is_object()) return 0;
  return tokensPerS / kBlock * perSample / procs / (ceiling.value("gflops_per_s", 0.0) * 1e9);
}

CohortResult readRun(const std::string& run) {
  const std::vector<double> windows = bench::windowRates(run, "tokens_per_s");
  if (windows.empty()) {
    throw BenchFailure(run + ": no metrics window after the warm-up one (too few steps)");
  }
  std::ifstream in(run + "/summary.json");
  const auto s = nlohmann::json::parse(in);
  return {bench::overallRate(windows), s.value("phase_ms_per_step", nlohmann::json::object()),
          s.value("compute", nlohmann::json::object()), s.value("utilization", nlohmann::json::object())};
}

std::atomic<int> runs{0};  // each run its own directory
std::string allocator;   // --allocator: both sides' (bench/launch_env.py); "" none

// With `tag`, a second copy can run at the same time.
CohortResult runCohort(const test::TempDir& dir, const Data& data, const Config& c, int procs,
                       const std::string& tag = "") {
  const std::string job = dir.file(fmt::format("gpt-{}-{}x{}{}.yaml", c.precision, procs, c.threads, tag));
  // log_every = warmup and steps a multiple of it: the first window is the
  // warm-up, the others are equal.
  test::writeText(job, fmt::format(R"(name: bench-gpt
model: {{arch: gpt, n_layer: {}, n_head: {}, n_embd: {}, block_size: {}, dropout: 0.0}}
data:
  train: {{kind: tokens, path: {}}}
  eval: {{kind: none}}
  loader_threads: 1
distribution: {{threads_per_rank: {}}}
training:
  epochs: 100
  max_steps: {}
  batch_size: {}
  log_every: {}
  precision: {}
  optimizer: {{name: adamw, lr: 0.003, betas: [0.9, 0.99], weight_decay: 0.1}}
  schedule: {{name: constant}}
checkpoint: {{enabled: false}}
output: {{progress: off, save_final: false}}
compute: {{allocator: {}}}
)", kLayers, kHeads, kEmbd, kBlock, data.train, c.threads, c.warmup + c.steps, kBatch,
                                   c.warmup, c.precision, allocator == "glibc" ? "system" : "keep"));
  const std::string run =
      dir.file(fmt::format("run-{}-{}x{}{}-{}", c.precision, procs, c.threads, tag, runs++));
  const auto r = test::run({COHORT_BIN, "run", job, "--procs", std::to_string(procs), "--run-dir", run},
                           bench::launchEnvironment(allocator, c.threads), std::chrono::minutes(60));
  if (r.exitCode != 0) throw BenchFailure("cohort run failed:\n" + r.describe());
  return readRun(run);
}

nlohmann::json runPytorch(const Data& data, const Config& c, int procs) {
  const auto r = test::run(
      {COHORT_PYTHON, std::string(COHORT_SOURCE_DIR) + "/bench/peers/gpt.py", "ddp", "--vocab-size",
       std::to_string(data.vocab), "--block-size", std::to_string(kBlock), "--n-layer",
       std::to_string(kLayers), "--n-head", std::to_string(kHeads), "--n-embd", std::to_string(kEmbd),
       "--batch", std::to_string(kBatch), "--world", std::to_string(procs), "--steps",
       std::to_string(c.steps), "--warmup", std::to_string(c.warmup), "--threads",
       std::to_string(c.threads), "--precision", c.precision, "--port", std::to_string(test::freePort())},
      bench::launchEnvironment(allocator, c.threads), std::chrono::minutes(60));
  const auto at = r.out.rfind("{\"peer\"");
  if (r.exitCode != 0 || at == std::string::npos) {
    throw BenchFailure("PyTorch peer failed:\n" + r.describe());
  }
  return nlohmann::json::parse(r.out.substr(at));
}

struct Row {
  Config c;
  int procs;
  double cohortTps, torchTps, ratioMin, ratioMax;
  CohortResult cohort;
  nlohmann::json torch;
};

nlohmann::json rowJson(const Row& r, const Data& data) {
  return {{"bench", "gpt"},
          {"precision", r.c.precision},
          {"n_layer", kLayers},
          {"n_head", kHeads},
          {"n_embd", kEmbd},
          {"block_size", kBlock},
          {"vocab_size", data.vocab},
          {"batch", kBatch},
          {"ranks", r.procs},
          {"threads", r.c.threads},
          {"steps", r.c.steps},
          {"cohort_tokens_per_s", r.cohortTps},
          {"pytorch_tokens_per_s", r.torchTps},
          {"ratio", r.cohortTps / r.torchTps},
          {"ratio_min", r.ratioMin},
          {"ratio_max", r.ratioMax},
          {"cohort_kernels", r.cohort.compute.value("kernels", "")},
          {"cohort_mfu", mfuOf(r.cohort, r.cohortTps, r.procs)},
          {"gemm_ceiling", r.cohort.utilization.value("gemm_ceiling", nlohmann::json())},
          {"cohort_phase_ms", r.cohort.phases},
          {"pytorch_phase_ms", r.torch["phase_ms"]},
          {"torch", r.torch.value("torch", "")},
          {"allocator", allocator.empty() ? "each side's default" : allocator},
          {"cohort_malloc", r.cohort.compute.value("malloc", "")},
          {"pytorch_launch", r.torch.value("launch", nlohmann::json())}};
}

// cohort and PyTorch alternately, `repeat` times: the mean rates' ratio, and
// the extremes of one pair's.
Row sideBySide(const test::TempDir& dir, const Data& data, const Config& c, int procs, int repeat) {
  Row r{c, procs, 0, 0, 1e300, 0, {}, {}};
  for (int k = 0; k < repeat; ++k) {
    CohortResult co = runCohort(dir, data, c, procs);
    nlohmann::json pt = runPytorch(data, c, procs);
    bench::requireSameLaunch(co.compute, pt.value("launch", nlohmann::json()),
                             fmt::format("{} {} ranks x {} threads", c.precision, procs, c.threads));
    const double ptTps = pt["tokens_per_s"].get<double>();
    r.cohortTps += co.tokensPerS / repeat;
    r.torchTps += ptTps / repeat;
    r.ratioMin = std::min(r.ratioMin, co.tokensPerS / ptTps);
    r.ratioMax = std::max(r.ratioMax, co.tokensPerS / ptTps);
    r.cohort = std::move(co);
    r.torch = std::move(pt);
  }
  return r;
}

int runBench(const std::string& only, double scale, int repeat) {
  const CpuInfo cpu = cpuInfo();
  const bool nativeBf16 =
      std::any_of(cpu.features.begin(), cpu.features.end(),
                  [](const std::string& f) { return f == "avx512_bf16" || f == "amx_bf16"; });
  std::cout << "cpu: " << describe(cpu) << "\n"
            << "bf16: " << (nativeBf16 ? "native kernels" : "emulated (no avx512_bf16 or amx_bf16)")
            << "\n";
  test::TempDir dir;
  const Data data = makeData(dir);
  std::cout << fmt::format(
      "model: GPT {} layers x {} heads, n_embd {}, block {}, vocab {}; batch {} windows per rank\n\n",
      kLayers, kHeads, kEmbd, kBlock, data.vocab, kBatch);
  std::cout << fmt::format("{:<9} {:>5} {:>7} | {:>12} {:>6} {:>9} {:>7} {:>13} | {:>10} {:>11} {:>9} {:>6}\n",
                           "precision", "ranks", "threads", "cohort tok/s", "MFU", "PyTorch", "ratio", "(one pair)",
                           "eff cohort", "eff PyTorch", "no comm", "of it");
  auto print = [](const Row& r, double effC, double effT, double ceiling) {
    std::cout << fmt::format("{:<9} {:>5} {:>7} | {:>12.0f} {:>5.1f}% {:>9.0f} {:>6.2f}x {:>5.2f}-{:<5.2f}x |",
                             r.c.precision, r.procs, r.c.threads, r.cohortTps,
                             100 * mfuOf(r.cohort, r.cohortTps, r.procs), r.torchTps, r.cohortTps / r.torchTps,
                             r.ratioMin, r.ratioMax);
    if (r.procs > 1) {
      std::cout << fmt::format(" {:>9.1f}% {:>10.1f}% {:>8.1f}% {:>6.3f}", 100 * effC, 100 * effT,
                               100 * ceiling, effC / ceiling);
    }
    std::cout << std::endl;
  };
  std::vector<Row> ones, twos;  // per precision run
  std::vector<nlohmann::json> lines;
  for (const char* precision : {"fp32", "bf16"}) {
    if (!only.empty() && precision != only) continue;
    Config c{precision};
    // A whole number of log_every (= warmup) windows.
    c.steps = c.warmup * std::max(1, static_cast<int>(std::lround(c.steps * scale / c.warmup)));
    ones.push_back(sideBySide(dir, data, c, 1, repeat));
    print(ones.back(), 0, 0, 0);
    lines.push_back(rowJson(ones.back(), data));
    twos.push_back(sideBySide(dir, data, c, 2, repeat));
    const Row& one = ones.back();
    const Row& two = twos.back();
    // The ceiling: two 1-rank runs at once, no communication at all.
    std::atomic<int> tag{0};
    const auto [a, b] =
        bench::together([&] { return runCohort(dir, data, c, 1, fmt::format("-{}", tag++)); });
    const double ceiling = (a.tokensPerS + b.tokensPerS) / (2 * one.cohortTps);
    const double effC = two.cohortTps / (2 * one.cohortTps);
    const double effT = two.torchTps / (2 * one.torchTps);
    print(two, effC, effT, ceiling);
    nlohmann::json j = rowJson(two, data);
    j["cohort_efficiency"] = effC;
    j["pytorch_efficiency"] = effT;
    j["independent_efficiency"] = ceiling;
    j["efficiency_of_ceiling"] = effC / ceiling;
    lines.push_back(j);
  }
  nlohmann::json speedup;
  if (ones.size() == 2) {
    const double c1 = ones[1].cohortTps / ones[0].cohortTps, c2 = twos[1].cohortTps / twos[0].cohortTps;
    const double t1 = ones[1].torchTps / ones[0].torchTps, t2 = twos[1].torchTps / twos[0].torchTps;
    std::cout << fmt::format(
        "\nbf16 / fp32 tokens/s: cohort {:.2f}x at 1 rank, {:.2f}x at 2 ranks; PyTorch {:.2f}x at 1 "
        "rank, {:.2f}x at 2 ranks\n",
        c1, c2, t1, t2);
    speedup = {{"bench", "gpt_bf16_speedup"}, {"cohort_1_rank", c1}, {"cohort_2_ranks", c2},
               {"pytorch_1_rank", t1},        {"pytorch_2_ranks", t2}};
  }
  std::cout << "\nper-step breakdown, ms (cohort rank 0; PyTorch rank 0: forward incl. the loss, "
               "backward incl. allreduce, optimizer)\n";
  for (const auto& l : lines) {
    const auto& p = l["cohort_phase_ms"];
    auto g = [&](const char* k) { return p.contains(k) ? p[k].get<double>() : 0.0; };
    const double total = g("data_wait") + g("forward") + g("backward") + g("exposed_comm") + g("optimizer");
    std::cout << fmt::format(
        "{:<4} {} ranks x {} threads: data wait {:.1f}, forward {:.1f}, backward {:.1f}, exposed comm "
        "{:.1f} ({:.1f}% of the step), optimizer {:.1f} | PyTorch: forward {:.1f}, backward {:.1f}, "
        "optimizer {:.1f}\n",
        l["precision"].get<std::string>(), l["ranks"].get<int>(), l["threads"].get<int>(), g("data_wait"),
        g("forward"), g("backward"), g("exposed_comm"), total > 0 ? 100 * g("exposed_comm") / total : 0.0,
        g("optimizer"), l["pytorch_phase_ms"]["forward"].get<double>(),
        l["pytorch_phase_ms"]["backward"].get<double>(), l["pytorch_phase_ms"]["optimizer"].get<double>());
  }
  std::cout << nlohmann::json{{"bench", "cpu"}, {"model", cpu.model}, {"features", cpu.features}}.dump()
            << "\n";
  for (const auto& l : lines) std::cout << l.dump() << "\n";
  if (!speedup.is_null()) std::cout << speedup.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;
  double scale = 1;
  int repeat = 2;
  std::string isa = "native";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--only" && (v == "fp32" || v == "bf16")) {
      only = v;
    } else if (a == "--steps-scale" && std::atof(v.c_str()) > 0) {
      scale = std::atof(v.c_str());
    } else if (a == "--repeat" && !v.empty()) {
      repeat = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--allocator" && !v.empty()) {
      allocator = v;
    } else if (a == "--isa" && !v.empty()) {
      isa = v;
    } else {
      std::cerr << "usage: cohort_bench_gpt [--repeat N] [--steps-scale F] [--only fp32|bf16] "
                   "[--allocator glibc|tcmalloc|jemalloc] [--isa native|avx2|env]\n";
      return 2;
    }
  }
  try {
    std::cout << bench::applyIsa(isa) << "\n";  // inherited by both sides' processes
  } catch (const std::invalid_argument& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  try {
    return runBench(only, scale, repeat);  // its temporary directory is gone when it returns or throws
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
