// bench/adamw: the optimizer step of cohort's fused AdamW
// (src/train/fused_adamw.cc) against LibTorch's torch::optim::AdamW on the
// same parameters and gradients, side by side in one process.
//
// Two parameter sets, the shapes of cohort's own models: the GPT of
// examples/gpt-kjv.yaml (0.8M parameters) and ResNet-18 (11.7M in 62
// tensors), each at 1 and 2 threads. Each round
// times --steps steps of one optimizer then of the other, the order
// alternating between rounds; the figure is the median over --rounds
// rounds of the time per step, and the headline the ratio of the medians.
// GB/s: the fused step's 28 bytes per parameter (reading the parameter,
// gradient and two averages, writing the parameter and the averages) over
// its time.
//
//   cohort_bench_adamw [--rounds 7] [--seconds 0.5] [--threads 1,2]

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cohort/core/cpu.h"
#include "cohort/models/model.h"
#include "train/detail/fused_adamw.h"

using namespace cohort;

namespace {

using Shapes = std::vector<std::vector<int64_t>>;

// The parameter shapes of cohort's model `arch` as the examples build it:
// gpt as examples/gpt-kjv.yaml (byte-level, 4 layers of 4 heads, 128 wide,
// 256 positions), resnet18 for 1000 classes.
Shapes modelShapes(const std::string& arch) {
  ModelConfig mc;
  mc.arch = choiceFromName<ModelArch>(arch).value();
  mc.numClasses = 1000;
  mc.nLayer = 4;
  mc.nHead = 4;
  mc.nEmbd = 128;
  mc.blockSize = 256;
  mc.vocabSize = 256;
  mc.memoryFormat = MemoryLayout::contiguous;
  Shapes out;
  for (const auto& p : models::createModel(mc, {3, 32, 32})->parameters()) out.push_back(p.sizes().vec());
  return out;
}

struct Side {
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

Side makeSide(const Shapes& shapes, bool fused) {
  torch::manual_seed(0);
  Side s;
  for (const auto& shape : shapes) {
    at::Tensor p = torch::randn(shape);
    p.mutable_grad() = torch::randn(shape) * 1e-2;
    s.params.push_back(p);
  }
  torch::optim::AdamWOptions o(1e-3);
  o.weight_decay(1e-2);
  if (fused) {
    s.optimizer = std::make_unique<train::detail::FusedAdamW>(s.params, o);
  } else {
    s.optimizer = std::make_unique<torch::optim::AdamW>(s.params, o);
  }
  return s;
}

double secondsPerStep(torch::optim::Optimizer& o, int steps) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) o.step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  double seconds = 0.5;
  std::vector<int> threads = {1, 2};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--rounds" && more) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--seconds" && more) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--threads" && more) {
      threads.clear();
      const std::string list = argv[++i];
      for (size_t at = 0; at < list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        threads.push_back(std::max(1, std::atoi(list.substr(at, comma - at).c_str())));
        at = comma + 1;
      }
    } else {
      std::cerr << "usage: cohort_bench_adamw [--rounds N] [--seconds S] [--threads 1,2]\n";
      return 2;
    }
  }
  at::set_num_interop_threads(1);
  std::cout << "cpu: " << describe(cpuInfo()) << "\n"
            << fmt::format("median of {} alternating rounds of ~{} s per side\n\n", rounds, seconds)
            << fmt::format("{:<9} {:>8} {:>7} {:>3} | {:>12} {:>12} | {:>7} {:>9}\n", "params", "count",
                           "tensors", "thr", "AdamW ms", "fused ms", "ratio", "fused GB/s");
  std::vector<nlohmann::json> lines;
  for (const std::string name : {"gpt", "resnet18"}) {
    const Shapes shapes = modelShapes(name);
    int64_t count = 0;
    for (const auto& s : shapes) {
      int64_t n = 1;
      for (int64_t d : s) n *= d;
      count += n;
    }
    for (int t : threads) {
      at::set_num_threads(t);
      Side reference = makeSide(shapes, false), fused = makeSide(shapes, true);
      // Warm-up (the states' allocation), then the steps per round from the
      // slower side's fastest step (at least 5: on a loaded machine one step
      // can stall far beyond its usual time).
      double once = 0;
      for (auto* o : {reference.optimizer.get(), fused.optimizer.get()}) {
        o->step();
        double fastest = secondsPerStep(*o, 1);
        for (int i = 0; i < 2; ++i) fastest = std::min(fastest, secondsPerStep(*o, 1));
        once = std::max(once, fastest);
      }
      const int steps = std::max(5, static_cast<int>(seconds / once));
      std::vector<double> a, b;
      for (int r = 0; r < rounds; ++r) {
        if (r % 2 == 0) {
          a.push_back(secondsPerStep(*reference.optimizer, steps));
          b.push_back(secondsPerStep(*fused.optimizer, steps));
        } else {
          b.push_back(secondsPerStep(*fused.optimizer, steps));
          a.push_back(secondsPerStep(*reference.optimizer, steps));
        }
      }
      const double ma = median(a), mb = median(b);
      const double gbps = 28.0 * static_cast<double>(count) / mb / 1e9;
      std::cout << fmt::format("{:<9} {:>8} {:>7} {:>3} | {:>12.3f} {:>12.3f} | {:>6.2f}x {:>9.1f}\n", name,
                               count, shapes.size(), t, ma * 1e3, mb * 1e3, ma / mb, gbps)
                << std::flush;
      lines.push_back({{"params", name},
                       {"count", count},
                       {"tensors", shapes.size()},
                       {"threads", t},
                       {"steps_per_round", steps},
                       {"adamw_ms", ma * 1e3},
                       {"fused_ms", mb * 1e3},
                       {"ratio", ma / mb},
                       {"fused_gb_per_s", gbps}});
    }
  }
  std::cout << "\n";
  for (const auto& j : lines) std::cout << j.dump() << "\n";
  return 0;
}
