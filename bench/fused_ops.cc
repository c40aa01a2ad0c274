// The fused training ops (src/models/fused_ops.h) against the ATen ops they
// replace: forward and backward of each, side by side on the same tensors,
// alternating, repeated; the median of each and their ratio. At the GPT
// example's shapes (4096 rows: 16 sequences of 256; n_embd 128, the MLP
// 512 wide) and ResNet-18's layer groups at 32 px (small_input), batch 32,
// channels-first and channels-last; linear layers through oneDNN
// (models/linear.h) against at::linear at the GPT's and decoding's shapes;
// one-pixel convolutions as a product over their window
// (models/window_conv.h) and weight-heavy ones over the unfolded input
// (models/gemm_conv.h) against the module's forward; the bfloat16 forms
// (the attention's causal softmax, GELU, a linear layer's bias and the
// residual add + LayerNorm under autocast) against ATen's bfloat16 ops;
// on 1 and 2 threads. Both sides allocate as a cohort rank does
// (compute.allocator: keep, core/malloc_policy.h), unless another allocator
// is preloaded. Prints the CPU, a table, and one JSON line per row.
//
//   build/bench/cohort_bench_fused_ops [--repeats 11] [--min-ms 60] [--threads 1,2 | 1 | 2]
//                                      [--only SUBSTRING-OF-OP]

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cohort/core/cpu.h"
#include "cohort/core/malloc_policy.h"
#include "cohort/models/linear.h"
#include "models/fused_kernels.h"
#include "models/fused_ops.h"
#include "models/window_conv.h"

using namespace cohort;
using Clock = std::chrono::steady_clock;

namespace {

struct Case {
  std::string op, shape;
  std::function<void()> aten, fused;
};

double msOf(const std::function<void()>& f, int iterations) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / iterations;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

at::Tensor leaf(std::vector<int64_t> sizes) { return torch::randn(sizes).requires_grad_(true); }

std::vector<Case> cases() {
  std::vector<Case> out;
  const int64_t rows = 16 * 256;
  for (bool tanh : {false, true}) {
    // The MLP's c_fc: [4096, 128] -> [4096, 512], the same product (bias
    // inside) on both sides, then ATen's GELU or the fused one.
    auto x = leaf({rows, 128}), w = leaf({512, 128}), b = leaf({512});
    auto g = torch::randn({rows, 512});
    const char* approx = tanh ? "tanh" : "none";
    out.push_back({tanh ? "linear+gelu(tanh)" : "linear+gelu", "[4096,128]x[512,128]^T",
                   [=] { torch::gelu(models::linear(x, w, b), approx).backward(g); },
                   [=] { models::detail::biasGeluFused(models::linear(x, w, b), {}, tanh).backward(g); }});
    // The elementwise part alone: GELU, then bias + GELU.
    auto h = leaf({rows, 512});
    out.push_back({tanh ? "gelu(tanh)" : "gelu", "[4096,512]", [=] { torch::gelu(h, approx).backward(g); },
                   [=] { models::detail::biasGeluFused(h, {}, tanh).backward(g); }});
    // In bfloat16, as under bf16 autocast (the bias already added by the
    // linear layer).
    auto hb = h.detach().to(at::kBFloat16).requires_grad_(true);
    auto gb = g.to(at::kBFloat16);
    out.push_back({tanh ? "gelu(tanh) bf16" : "gelu bf16", "[4096,512]",
                   [=] { torch::gelu(hb, approx).backward(gb); },
                   [=] { models::detail::geluBf16Fused(hb, tanh).backward(gb); }});
    out.push_back({tanh ? "bias+gelu(tanh)" : "bias+gelu", "[4096,512]",
                   [=] { torch::gelu(h + b, approx).backward(g); },
                   [=] { models::detail::biasGeluFused(h, b, tanh).backward(g); }});
  }
  {
    auto x = leaf({rows, 128}), d = leaf({rows, 128}), w = leaf({128}), b = leaf({128});
    auto gs = torch::randn({rows, 128}), gy = torch::randn({rows, 128});
    out.push_back({"add+layer_norm", "[4096,128]",
                   [=] {
                     at::Tensor s = x + d;
                     at::Tensor y = torch::layer_norm(s, {128}, w, b, 1e-5);
                     torch::autograd::backward({s, y}, {gs, gy});
                   },
                   [=] {
                     const models::AddNorm a = models::detail::addLayerNormFused(x, d, w, b, 1e-5);
                     torch::autograd::backward({a.sum, a.norm}, {gs, gy});
                   }});
  }
  {
    // Under bf16 autocast: a float32 residual stream, a bfloat16 branch.
    auto x = leaf({16, 256, 128}), w = leaf({128}), b = leaf({128});
    auto d = torch::randn({16, 256, 128}).to(at::kBFloat16).requires_grad_(true);
    auto gs = torch::randn({16, 256, 128}), gy = torch::randn({16, 256, 128});
    auto autocast = [](const std::function<void()>& f) {
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      f();
      at::autocast::set_cpu_enabled(false);
      at::autocast::clear_cache();
    };
    out.push_back({"add+layer_norm bf16", "[16,256,128]+bf16",
                   [=] {
                     at::Tensor s, y;
                     autocast([&] {
                       s = x + d;
                       y = torch::layer_norm(s, {128}, w, b, 1e-5);
                     });
                     torch::autograd::backward({s, y}, {gs, gy});
                   },
                   [=] {
                     models::AddNorm a;
                     autocast([&] { a = models::addLayerNorm(x, d, w, b, 1e-5); });
                     torch::autograd::backward({a.sum, a.norm}, {gs, gy});
                   }});
  }
  {
    // Forward alone, without gradients.
    auto x = torch::randn({rows, 128}), d = torch::randn({rows, 128}), w = torch::randn({128}),
         b = torch::randn({128});
    out.push_back({"add+layer_norm fwd", "[4096,128]",
                   [=] { torch::layer_norm(x + d, {128}, w, b, 1e-5); },
                   [=] { models::detail::addLayerNormFused(x, d, w, b, 1e-5); }});
  }
  // The attention's causal softmax (models/fused_ops.h): the GPT example's
  // scores [16, 4, 256, 256] in bfloat16 (what autocast runs), masked above
  // the diagonal; forward alone and forward + backward.
  {
    const at::Tensor mask = torch::full({256, 256}, -INFINITY).triu(1);
    auto scores = (torch::randn({16, 4, 256, 256}) + mask).to(at::kBFloat16).requires_grad_(true);
    auto g = torch::randn({16, 4, 256, 256}).to(at::kBFloat16);
    out.push_back({"causal softmax bf16", "[16,4,256,256]", [=] { torch::softmax(scores, -1).backward(g); },
                   [=] { models::detail::causalSoftmaxFused(scores).backward(g); }});
    auto fixed = scores.detach();
    out.push_back({"causal softmax bf16 fwd", "[16,4,256,256]", [=] { torch::softmax(fixed, -1); },
                   [=] { models::detail::causalSoftmaxFused(fixed); }});
  }
  // Linear layers through oneDNN's sgemm (models/linear.h) against
  // at::linear: the GPT example's products forward and backward, and
  // decoding's few rows (GPT-2 small's widths) forward alone.
  for (const auto& [in, width] :
       std::vector<std::pair<int64_t, int64_t>>{{128, 384}, {128, 512}, {512, 128}, {128, 256}}) {
    auto x = leaf({rows, in}), w = leaf({width, in}), b = leaf({width});
    auto g = torch::randn({rows, width});
    out.push_back({"linear (onednn)", fmt::format("[4096,{}]x[{},{}]^T", in, width, in),
                   [=] { at::linear(x, w, b).backward(g); }, [=] { models::linear(x, w, b).backward(g); }});
  }
  // Under bf16 autocast: the same bfloat16 product on both sides, then
  // LibTorch's C++ linear adds the float32 bias (output += bias) where
  // cohort's bfloat16 kernel does (models/linear.h); forward and backward.
  for (const auto& [in, width] : std::vector<std::pair<int64_t, int64_t>>{{128, 384}, {128, 512}, {512, 128}}) {
    auto x = leaf({16, 256, in}), w = leaf({width, in}), b = leaf({width});
    auto g = torch::randn({16, 256, width}).to(at::kBFloat16);
    auto autocast = [](const std::function<at::Tensor()>& f) {
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      at::Tensor y = f();
      at::autocast::set_cpu_enabled(false);
      at::autocast::clear_cache();
      return y;
    };
    out.push_back({"linear bias bf16", fmt::format("[16,256,{}]x[{},{}]^T", in, width, in),
                   [=] { autocast([&] { return torch::nn::functional::linear(x, w, b); }).backward(g); },
                   [=] { autocast([&] { return models::linear(x, w, b); }).backward(g); }});
  }
  for (const auto& [m, in, width] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 768, 3072}, {8, 768, 768}}) {
    auto x = torch::randn({m, in}), w = torch::randn({width, in}), b = torch::randn({width});
    out.push_back({"linear fwd (onednn)", fmt::format("[{},{}]x[{},{}]^T", m, in, width, in),
                   [=] { at::linear(x, w, b); }, [=] { models::linear(x, w, b); }});
  }
  // Convolutions of one output pixel as a product over their window
  // (models/window_conv.h): ResNet-18's last layer group at 32 px, batch 32.
  struct OnePixel {
    std::vector<int64_t> x;
    int64_t out, k, stride;
  };
  for (const OnePixel& c : std::vector<OnePixel>{{{32, 512, 1, 1}, 512, 3, 1},
                                                 {{32, 256, 2, 2}, 512, 3, 2},
                                                 {{32, 256, 2, 2}, 512, 1, 2}}) {
    auto conv = std::make_shared<torch::nn::Conv2dImpl>(
        torch::nn::Conv2dOptions(c.x[1], c.out, c.k).stride(c.stride).padding(c.k / 2).bias(false));
    auto x = leaf(c.x);
    auto g = torch::randn({c.x[0], c.out, 1, 1});
    out.push_back({"conv 1 pixel (window)",
                   fmt::format("[{}]*{}x{} s{}", fmt::join(c.x, ","), c.k, c.k, c.stride),
                   [=] { conv->forward(x).backward(g); }, [=] { models::conv2d(*conv, x).backward(g); }});
  }
  // Convolutions whose weight outweighs their output over the unfolded
  // input (models/gemm_conv.h), channels-last as the models run them:
  // ResNet-50's layer4 and layer3 at 64 px, batch 8; ResNet-18's layer3 at
  // 32 px, batch 32; ResNet-50's layer4 at 224 px, batch 8 (392 output
  // pixels: the rule's edge).
  for (const OnePixel& c : std::vector<OnePixel>{{{8, 512, 2, 2}, 512, 3, 1},
                                                 {{8, 512, 2, 2}, 2048, 1, 1},
                                                 {{8, 2048, 2, 2}, 512, 1, 1},
                                                 {{8, 1024, 4, 4}, 2048, 1, 2},
                                                 {{8, 256, 4, 4}, 256, 3, 1},
                                                 {{8, 1024, 4, 4}, 256, 1, 1},
                                                 {{32, 256, 2, 2}, 256, 3, 1},
                                                 {{8, 512, 7, 7}, 512, 3, 1},
                                                 {{8, 512, 7, 7}, 2048, 1, 1},
                                                 {{8, 2048, 7, 7}, 512, 1, 1}}) {
    auto conv = std::make_shared<torch::nn::Conv2dImpl>(
        torch::nn::Conv2dOptions(c.x[1], c.out, c.k).stride(c.stride).padding(c.k / 2).bias(false));
    {
      torch::NoGradGuard noGrad;
      conv->weight.set_data(conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
    }
    auto x = torch::randn(c.x).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true);
    const int64_t side = (c.x[2] - 1) / c.stride + 1;
    auto g = torch::randn({c.x[0], c.out, side, side}).contiguous(at::MemoryFormat::ChannelsLast);
    out.push_back({"conv (unfolded, nhwc)", fmt::format("[{}]*{}x{}->{} s{}", fmt::join(c.x, ","), c.k, c.k, c.out, c.stride),
                   [=] { conv->forward(x).backward(g); }, [=] { models::conv2d(*conv, x).backward(g); }});
  }
  const std::vector<std::vector<int64_t>> images = {{32, 64, 32, 32}, {32, 128, 16, 16}, {32, 256, 8, 8},
                                                    {32, 512, 4, 4}};
  for (bool channelsLast : {false, true}) {
    for (const auto& s : images) {
      const at::MemoryFormat f = channelsLast ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
      auto x = torch::randn(s).contiguous(f).requires_grad_(true);
      auto w = leaf({s[1]}), b = leaf({s[1]});
      auto rm = torch::zeros({s[1]}), rv = torch::ones({s[1]});
      auto g = torch::randn(s).contiguous(f);
      out.push_back({channelsLast ? "bn+relu (nhwc)" : "bn+relu", fmt::format("[{}]", fmt::join(s, ",")),
                     [=] { torch::relu(torch::batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, false)).backward(g); },
                     [=] { models::detail::batchNormReluFused(x, w, b, rm, rv, 0.1, 1e-5).backward(g); }});
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 11;
  double minMs = 60;
  std::vector<int> threadCounts = {1, 2};
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--min-ms") == 0) minMs = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
    if (std::strcmp(argv[i], "--threads") == 0 && std::strcmp(argv[i + 1], "1,2") != 0) {
      threadCounts = {std::atoi(argv[i + 1])};
    }
  }
  torch::manual_seed(0);
  const char* preload = std::getenv("LD_PRELOAD");
  const bool keep = preload == nullptr && keepFreedMemory();
  fmt::print("allocator: {}\n", keep ? "glibc keeping freed memory, as a cohort rank (compute.allocator: keep)"
                                      : preload != nullptr ? fmt::format("LD_PRELOAD={}", preload)
                                                           : std::string("glibc"));
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  fmt::print("cpu: {}\nfused loops: the {} build (the widest; ATEN_CPU_CAPABILITY=avx2 holds them and LibTorch "
             "to AVX2)\nat::linear's products: LibTorch's BLAS, OPENBLAS_CORETYPE {}\n"
             "forward + backward, ms per call: median of {} alternating runs of >= {} ms each\n",
             describe(cpuInfo()), models::detail::fusedKernelsIsa(), coretype ? coretype : "unset (its own choice)",
             repeats, minMs);
  fmt::print("{:<20} {:<24} {:>7} {:>10} {:>10} {:>8}\n", "op", "shape", "threads", "aten ms", "fused ms",
             "speedup");
  std::vector<std::string> json;
  const std::vector<Case> all = cases();
  for (int threads : threadCounts) {
    at::set_num_threads(threads);
    for (const Case& c : all) {
      if (c.op.find(only) == std::string::npos) continue;
      // Warm up, and size a run to at least minMs.
      msOf(c.aten, 2);
      msOf(c.fused, 2);
      const int iterations = std::max(1, static_cast<int>(minMs / std::max(0.01, msOf(c.aten, 3))));
      std::vector<double> aten, fused;
      for (int r = 0; r < repeats; ++r) {
        aten.push_back(msOf(c.aten, iterations));
        fused.push_back(msOf(c.fused, iterations));
      }
      const double a = median(aten), f = median(fused);
      fmt::print("{:<20} {:<24} {:>7} {:>10.3f} {:>10.3f} {:>7.2f}x\n", c.op, c.shape, threads, a, f, a / f);
      json.push_back(fmt::format(R"({{"op":"{}","shape":"{}","threads":{},"aten_ms":{:.4f},"fused_ms":{:.4f},)"
                                 R"("speedup":{:.3f},"isa":"{}"}})",
                                 c.op, c.shape, threads, a, f, a / f, models::detail::fusedKernelsIsa()));
    }
  }
  for (const std::string& j : json) fmt::print("{}\n", j);
  return 0;
}
