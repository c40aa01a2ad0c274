#include "models/window_conv.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <atomic>

#include "cohort/core/sgemm.h"
#include "models/detail/weight_product.h"
#include "models/gemm_conv.h"

namespace cohort::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<int64_t> windowCalls{0};

// The one output pixel's window: input rows [0, rows) meet taps
// [pad, pad + rows) (stride plays no part for a single output), and so for
// columns.
struct Window {
  int64_t rows = 0, cols = 0, padH = 0, padW = 0;
};

// productsTakeConvolution (models/gemm_conv.h) must hold.
bool windowOf(const torch::nn::Conv2dImpl& conv, const at::Tensor& x, Window* w) {
  const auto& o = conv.options;
  const auto& pad = c10::get<torch::ExpandingArray<2>>(o.padding());
  const auto k = o.kernel_size(), s = o.stride();
  const int64_t h = x.size(2), wd = x.size(3), ph = pad->at(0), pw = pad->at(1);
  if ((h + 2 * ph - k->at(0)) / s->at(0) + 1 != 1 || (wd + 2 * pw - k->at(1)) / s->at(1) + 1 != 1) return false;
  w->rows = std::min(h, k->at(0) - ph);
  w->cols = std::min(wd, k->at(1) - pw);
  w->padH = ph;
  w->padW = pw;
  return w->rows > 0 && w->cols > 0;
}

// The window's taps of a weight [out, C, kh, kw] (any strides) as
// [out, C x rows x cols] in (c, i, j) order, or (scatter) written back into
// a weight-shaped tensor whose other taps are already zero. Loops over the
// strides: a tensor slice with two taps a row copies two elements per
// iteration of ATen's copy, which measured 2x slower for ResNet's 2x2
// windows (one tap copies as fast through ATen, which it takes).
void windowTaps(const at::Tensor& weight, at::Tensor& taps, int64_t rows, int64_t cols, int64_t padH, int64_t padW,
                bool scatter) {
  const int64_t out = weight.size(0), c = weight.size(1);
  if (rows == 1 && cols == 1) {
    // One tap: ATen's strided copy of [out, C] is the faster one here.
    const at::Tensor tap = weight.select(3, padW).select(2, padH);
    if (scatter) {
      tap.copy_(taps.view({out, c}));
    } else {
      taps.view({out, c}).copy_(tap);
    }
    return;
  }
  const int64_t s0 = weight.stride(0), s1 = weight.stride(1), s2 = weight.stride(2), s3 = weight.stride(3);
  float* w = weight.data_ptr<float>();
  float* t = taps.data_ptr<float>();
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t ch = 0; ch < c; ++ch) {
      float* row = t + (o * c + ch) * rows * cols;
      const int64_t base = o * s0 + ch * s1 + padH * s2 + padW * s3;
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          float& ws = w[base + i * s2 + j * s3];
          if (scatter) {
            ws = row[i * cols + j];
          } else {
            row[i * cols + j] = ws;
          }
        }
      }
    }
  }
}

class WindowConvFunction : public torch::autograd::Function<WindowConvFunction> {
 public:
  // `bias` is an empty placeholder when !hasBias.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, bool hasBias, int64_t rows, int64_t cols, int64_t padH,
                            int64_t padW) {
    const int64_t n = x.size(0), out = weight.size(0);
    // [N, C x rows x cols] and [out, C x rows x cols], both in (c, i, j) order.
    const at::Tensor x2 = x.slice(2, 0, rows).slice(3, 0, cols).contiguous().view({n, -1});
    at::Tensor w2 = at::empty({out, weight.size(1) * rows * cols}, weight.options());
    windowTaps(weight, w2, rows, cols, padH, padW, false);
    const at::Tensor y = detail::weightProduct(x2, w2, hasBias ? bias : at::Tensor(), "cohort::window_conv",
                                               detail::WeightProductForm::convolution);
    ctx->save_for_backward({x2, w2});
    ctx->saved_data["x"] = x.sizes().vec();
    ctx->saved_data["w"] = weight.sizes().vec();
    ctx->saved_data["window"] = std::vector<int64_t>{rows, cols, padH, padW};
    ctx->saved_data["bias"] = hasBias;
    ctx->saved_data["channels_last"] =
        !weight.is_contiguous() && weight.is_contiguous(at::MemoryFormat::ChannelsLast);
    return y.view({n, out, 1, 1});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x2 = saved[0];
    const at::Tensor& w2 = saved[1];
    const std::vector<int64_t> xs = ctx->saved_data["x"].toIntVector(), ws = ctx->saved_data["w"].toIntVector(),
                               win = ctx->saved_data["window"].toIntVector();
    const int64_t n = x2.size(0), k = x2.size(1), out = w2.size(0);
    const at::Tensor g = grads[0].reshape({n, out}).contiguous();
    at::Tensor gx, gw, gb;
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) gb = detail::biasGradient(g);
    if (ctx->needs_input_grad(0)) {
      at::Tensor g2 = at::zeros({n, k}, x2.options());
      if (n > 0 && out > 0 && k > 0) {
        RECORD_FUNCTION("cohort::window_conv_grad_input", std::vector<c10::IValue>({g, w2}));
        oneDnnSgemm(false, false, n, k, out, 1.0f, g.data_ptr<float>(), out, w2.data_ptr<float>(), k, 0.0f,
                    g2.data_ptr<float>(), k);
      }
      const at::Tensor window = g2.view({n, xs[1], win[0], win[1]});
      if (win[0] == xs[2] && win[1] == xs[3]) {
        gx = window;
      } else {
        gx = at::zeros(xs, x2.options());
        gx.slice(2, 0, win[0]).slice(3, 0, win[1]).copy_(window);
      }
    }
    if (ctx->needs_input_grad(1)) {
      at::Tensor g2 = at::zeros({out, k}, w2.options());
      if (n > 0 && out > 0 && k > 0) {
        RECORD_FUNCTION("cohort::window_conv_grad_weight", std::vector<c10::IValue>({g, x2}));
        oneDnnSgemm(true, false, out, k, n, 1.0f, g.data_ptr<float>(), out, x2.data_ptr<float>(), k, 0.0f,
                    g2.data_ptr<float>(), k);
      }
      // Laid out as the weight is (channels-last or not): the gradient is
      // then kept as it is rather than copied into the weight's layout.
      gw = at::zeros(ws, w2.options().memory_format(ctx->saved_data["channels_last"].toBool()
                                                         ? at::MemoryFormat::ChannelsLast
                                                         : at::MemoryFormat::Contiguous));
      windowTaps(gw, g2, win[0], win[1], win[2], win[3], true);
    }
    return {gx, gw, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The window when conv2d takes the product for x.
bool windowTaken(const torch::nn::Conv2dImpl& conv, const at::Tensor& x, Window* w) {
  return productsTakeConvolution(conv, x) && windowOf(conv, x, w);
}

}  // namespace

bool windowConvTakes(const torch::nn::Conv2dImpl& conv, const at::Tensor& x) {
  Window w;
  return windowTaken(conv, x, &w);
}

at::Tensor conv2d(torch::nn::Conv2dImpl& conv, const at::Tensor& x) {
  Window w;
  if (!windowTaken(conv, x, &w)) return gemmConvTakes(conv, x) ? gemmConv(conv, x) : conv.forward(x);
  windowCalls.fetch_add(1, std::memory_order_relaxed);
  const bool hasBias = conv.bias.defined();
  return WindowConvFunction::apply(x, conv.weight, hasBias ? conv.bias : conv.weight.new_empty({0}), hasBias,
                                   w.rows, w.cols, w.padH, w.padW);
}

int64_t windowConvCalls() { return windowCalls.load(std::memory_order_relaxed); }

}  // namespace cohort::models
