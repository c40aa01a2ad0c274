// bench/attention: causal attention's forward and backward, the product of
// the whole score matrix (baddbmm into the mask, softmax, matmul) against the
// blockwise kernel (src/models/flash_attention.h), both through
// causalAttention on q, k, v laid out as the GPT makes them (views of one
// projection). The two alternate, --repeat rounds of --iters calls each
// after a warm-up; medians of the rounds. Also the bytes each keeps for
// backward beyond q, k, v and its output: the [B, H, T, T] weights against
// one logsumexp per row.
//
//   cohort_bench_attention [--repeat 7] [--iters 5] [--threads 1,2] [--shape B,H,T,D]

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cohort/core/cpu.h"
#include "cohort/models/gpt.h"
#include "models/flash_attention.h"

using namespace cohort;

namespace {

struct Shape {
  int64_t b, h, t, d;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per forward + backward, averaged over `iters` calls.
double timeOnce(bool matmulOnly, const Shape& s, const at::Tensor& projected, const at::Tensor& weight, int iters) {
  models::setAttentionMatmulOnly(matmulOnly);
  at::Tensor mask;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    std::vector<at::Tensor> qkv;
    for (const at::Tensor& m : projected.split(s.h * s.d, 2)) {
      qkv.push_back(m.view({s.b, s.t, s.h, s.d}).transpose(1, 2));
    }
    const at::Tensor y = models::causalAttention(qkv[0], qkv[1], qkv[2], mask, projected.options());
    torch::autograd::grad({(y * weight).sum()}, {projected});
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 7, iters = 5;
  std::vector<int> threads = {1, 2};
  std::vector<Shape> shapes = {Shape{16, 4, 256, 32}, Shape{8, 12, 512, 64}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeat" && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else if (a == "--iters" && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) {
      threads.clear();
      std::string list = argv[++i];
      for (size_t p = 0; p <= list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        threads.push_back(std::max(1, std::atoi(list.substr(p, q - p).c_str())));
        p = q + 1;
      }
    } else if (a == "--shape" && i + 1 < argc) {
      Shape s{};
      if (std::sscanf(argv[++i], "%ld,%ld,%ld,%ld", &s.b, &s.h, &s.t, &s.d) != 4 || s.b < 1 || s.h < 1 || s.t < 1 ||
          s.d < 1) {
        std::cerr << "--shape wants B,H,T,D (positive), not '" << argv[i] << "'\n";
        return 2;
      }
      shapes = {s};
    } else {
      std::cerr << "usage: cohort_bench_attention [--repeat N] [--iters N] [--threads 1,2] [--shape B,H,T,D]\n";
      return 2;
    }
  }
  at::set_num_interop_threads(1);
  std::cout << "cpu: " << describe(cpuInfo()) << "\n"
            << fmt::format("causal attention forward + backward, float32; median of {} rounds of {} calls\n\n",
                           repeat, iters)
            << fmt::format("{:>3} {:>3} {:>5} {:>4} {:>3} | {:>11} {:>12} | {:>7} | {:>10} {:>10}\n", "B", "H", "T",
                           "D", "thr", "matmul ms", "blockwise ms", "speedup", "matmul MB", "block MB");
  std::vector<nlohmann::json> lines;
  for (const Shape& s : shapes) {
    torch::manual_seed(0);
    const at::Tensor projected = torch::randn({s.b, s.t, 3 * s.h * s.d}).set_requires_grad(true);
    const at::Tensor weight = torch::randn({s.b, s.t, s.h * s.d});
    for (int n : threads) {
      at::set_num_threads(n);
      timeOnce(true, s, projected, weight, 1);  // warm-up
      timeOnce(false, s, projected, weight, 1);
      std::vector<double> matmul, blockwise;
      for (int r = 0; r < repeat; ++r) {
        matmul.push_back(timeOnce(true, s, projected, weight, iters));
        blockwise.push_back(timeOnce(false, s, projected, weight, iters));
      }
      const double m = median(matmul), f = median(blockwise);
      // Kept for backward beyond q, k, v and the output: softmax's output
      // [B, H, T, T] against the logsumexp [B, H, T] (and, for the kernel's
      // output in [B, T, H D], nothing more: it is the output).
      const double matmulMb = double(s.b * s.h * s.t * s.t) * 4 / 1e6;
      const double blockMb = double(s.b * s.h * s.t) * 4 / 1e6;
      std::cout << fmt::format("{:>3} {:>3} {:>5} {:>4} {:>3} | {:>11.2f} {:>12.2f} | {:>6.2f}x | {:>10.2f} "
                               "{:>10.3f}\n",
                               s.b, s.h, s.t, s.d, n, m * 1e3, f * 1e3, m / f, matmulMb, blockMb);
      lines.push_back({{"bench", "attention"},
                       {"b", s.b},
                       {"h", s.h},
                       {"t", s.t},
                       {"d", s.d},
                       {"threads", n},
                       {"matmul_ms", m * 1e3},
                       {"blockwise_ms", f * 1e3},
                       {"speedup", m / f},
                       {"matmul_saved_mb", matmulMb},
                       {"blockwise_saved_mb", blockMb}});
    }
  }
  models::setAttentionMatmulOnly(false);
  std::cout << "\n";
  for (const auto& j : lines) std::cout << j.dump() << "\n";
  return 0;
}
