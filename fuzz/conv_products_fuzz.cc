// Convolutions as matrix products (src/models/gemm_conv.h over the
// unfolded input, src/models/window_conv.h over a one-pixel window) through
// models::conv2d, against at::conv2d in float64, forward and backward, on
// shapes, layouts and values the input picks.
//
// Input: byte 0 the kernel (1x1, 3x3, 5x5, 3x2, 2x3, 1x3) and the stride
// ((1, 1), (2, 2), (2, 1)); byte 1 flags: the input's layout (contiguous,
// a strided view, channels-last), a channels-last weight, a bias, the
// padding (0, 1, 2, clipped to the kernel), and few out channels (then the
// rule mostly leaves the module's forward) rather than enough for the
// unfolded product; bytes 2-5 the batch (1, 2, 3, 5), the channels (1, 2,
// 3, 5, 7, 8, 9, 16, 17), height and width (1, 2, 3, 5, 7); byte 6 the few
// out channels; the rest the values, in [-4, 4) by 1/32, repeated to fill.
// A value or gradient off the float64 one by more than the rounding of its
// sum (2 (terms + 2) 2^-24 times the sum of the terms' magnitudes) is a
// finding, as is any exception.

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fuzz_tensor.h"
#include "fuzz_util.h"
#include "models/window_conv.h"

namespace {

constexpr int64_t kKernels[][2] = {{1, 1}, {3, 3}, {5, 5}, {3, 2}, {2, 3}, {1, 3}};
constexpr int64_t kStrides[][2] = {{1, 1}, {2, 2}, {2, 1}};
constexpr int64_t kBatch[] = {1, 2, 3, 5};
constexpr int64_t kChannels[] = {1, 2, 3, 5, 7, 8, 9, 16, 17};
constexpr int64_t kSides[] = {1, 2, 3, 5, 7};

using cohort::fuzz::inputValues;

// got against want (float64) within the rounding of sums of `terms` terms
// whose magnitudes sum to `scale`.
void compare(const at::Tensor& got, const at::Tensor& want, const at::Tensor& scale, int64_t terms,
             const std::string& what) {
  cohort::fuzz::require(got.defined() && want.defined() && got.sizes() == want.sizes(), what + ": shape");
  const at::Tensor g = got.detach().to(torch::kDouble), w = want.detach().to(torch::kDouble);
  const double eps = 1.0 / (1 << 24);
  const at::Tensor excess = (g - w).abs() - 2.0 * static_cast<double>(terms + 2) * eps * scale - 1e-12;
  if (excess.numel() > 0 && excess.max().item<double>() > 0) {
    cohort::fuzz::finding(what + " off by " + std::to_string((g - w).abs().max().item<double>()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 7) return 0;
  static const bool once = [] {
    at::set_num_threads(1);
    return true;
  }();
  (void)once;
  const int64_t kh = kKernels[data[0] % 6][0], kw = kKernels[data[0] % 6][1];
  const int64_t sh = kStrides[(data[0] / 6) % 3][0], sw = kStrides[(data[0] / 6) % 3][1];
  const uint8_t flags = data[1];
  const int layout = (flags & 3) % 3;  // contiguous, strided, channels-last
  const bool weightChannelsLast = (flags & 4) != 0, bias = (flags & 8) != 0, few = (flags & 128) != 0;
  const int64_t pad = (flags >> 4) % 3;
  const int64_t ph = std::min(pad, kh / 2), pw = std::min(pad, kw / 2);
  const int64_t n = kBatch[data[2] % 4], c = kChannels[data[3] % 9], h = kSides[data[4] % 5],
                w = kSides[data[5] % 5];
  const int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  if (h + 2 * ph < kh || w + 2 * pw < kw) return 0;  // no output: at::conv2d refuses it too
  const int64_t rows = n * oh * ow;
  const int64_t out = few ? 1 + data[6] % 7 : (kh * kw == 1 ? rows : 2 * rows + 1);
  const size_t v = 7;

  torch::nn::Conv2d conv(
      torch::nn::Conv2dOptions(c, out, {kh, kw}).stride({sh, sw}).padding({ph, pw}).bias(bias));
  const at::Tensor x64 = inputValues(data, size, v, {n, c, h, w});
  const at::Tensor w64 = inputValues(data, size, v + 1, {out, c, kh, kw}), b64 = inputValues(data, size, v + 2, {out});
  {
    torch::NoGradGuard noGrad;
    conv->weight.set_data(w64.to(at::kFloat).contiguous(weightChannelsLast ? at::MemoryFormat::ChannelsLast
                                                                             : at::MemoryFormat::Contiguous));
    if (bias) conv->bias.set_data(b64.to(at::kFloat));
  }
  at::Tensor x;
  if (layout == 1) {
    x = torch::zeros({n, c, h, 2 * w}).slice(3, 0, 2 * w, 2);
    x.copy_(x64);
  } else {
    x = x64.to(at::kFloat).contiguous(layout == 2 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
  }
  x = x.detach().requires_grad_(true);
  const at::Tensor gy64 = inputValues(data, size, v + 3, {n, out, oh, ow});

  at::Tensor y;
  try {
    y = cohort::models::conv2d(*conv, x);
    y.backward(gy64.to(at::kFloat));
  } catch (const std::exception& e) {
    cohort::fuzz::finding(std::string("conv2d threw: ") + e.what());
  }
  const at::Tensor xr = x64.clone().requires_grad_(true), wr = w64.clone().requires_grad_(true);
  const at::Tensor br = bias ? b64.clone().requires_grad_(true) : at::Tensor();
  const at::Tensor yr = at::conv2d(xr, wr, br, {sh, sw}, {ph, pw});
  yr.backward(gy64);
  // The terms' magnitudes: the same sums of |x|, |W|, |b| and |dy|.
  const at::Tensor ya = at::conv2d(x64.abs(), w64.abs(), bias ? b64.abs() : at::Tensor(), {sh, sw}, {ph, pw});
  const at::Tensor xl = torch::zeros_like(x64).requires_grad_(true), wl = torch::zeros_like(w64).requires_grad_(true);
  const at::Tensor gxScale =
      torch::autograd::grad({(at::conv2d(xl, w64.abs(), {}, {sh, sw}, {ph, pw}) * gy64.abs()).sum()}, {xl})[0];
  const at::Tensor gwScale =
      torch::autograd::grad({(at::conv2d(x64.abs(), wl, {}, {sh, sw}, {ph, pw}) * gy64.abs()).sum()}, {wl})[0];
  compare(y, yr, ya, c * kh * kw + 1, "y");
  compare(x.grad(), xr.grad(), gxScale, out * kh * kw, "grad x");
  compare(conv->weight.grad(), wr.grad(), gwScale, rows, "grad W");
  if (bias) compare(conv->bias.grad(), br.grad(), gy64.abs().sum({0, 2, 3}), rows, "grad b");
  return 0;
}
