#include "cohort/models/linear.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/util/accumulate.h>
#include <torch/torch.h>

#include <atomic>

#include "cohort/core/env.h"
#include "cohort/core/sgemm.h"
#include "models/detail/weight_product.h"
#include "models/fused_kernels.h"

namespace cohort::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<int64_t> oneDnnCalls{0};

bool takesOneDnn(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  for (const at::Tensor* t : {&x, &weight, &bias}) {
    if (t->defined() && !oneDnnProductsTake(*t)) return false;
  }
  return weight.defined() && weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1) &&
         (!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)));
}

// y [..., out] = x [..., in] W^T (+ bias).
at::Tensor product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const int64_t rows = c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return detail::weightProduct(x.reshape({rows, weight.size(1)}).contiguous(), weight.contiguous(), bias,
                               "cohort::linear", detail::WeightProductForm::linear)
      .view(shape);
}

class OneDnnLinearFunction : public torch::autograd::Function<OneDnnLinearFunction> {
 public:
  // `bias` is an empty placeholder when !hasBias: LibTorch's custom
  // functions take defined tensors only.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, bool hasBias) {
    // The inputs themselves: double backward differentiates through them.
    ctx->save_for_backward({x, weight});
    ctx->saved_data["bias"] = hasBias;
    return product(x, weight, hasBias ? bias : at::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const int64_t in = saved[1].size(1), out = saved[1].size(0);
    const int64_t m = c10::multiply_integers(saved[0].sizes().begin(), saved[0].sizes().end() - 1);
    const at::Tensor x2 = saved[0].reshape({m, in}).contiguous();
    const at::Tensor w = saved[1].contiguous();
    const at::Tensor g = grads[0].reshape({m, out}).contiguous();
    const c10::IntArrayRef shape = saved[0].sizes();
    at::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(2) && ctx->saved_data["bias"].toBool()) gb = detail::biasGradient(g);
    if (torch::GradMode::is_enabled()) {
      // The graph of the gradients is kept: ATen's products, differentiable.
      if (ctx->needs_input_grad(0)) gx = g.mm(w).view(shape);
      if (ctx->needs_input_grad(1)) gw = g.t().mm(x2);
      return {gx, gw, gb, at::Tensor()};
    }
    if (ctx->needs_input_grad(0)) {
      gx = at::empty({m, in}, x2.options());
      if (out == 0) {
        gx.zero_();
      } else if (m > 0 && in > 0) {
        RECORD_FUNCTION("cohort::linear_grad_input", std::vector<c10::IValue>({g, w}));
        oneDnnSgemm(false, false, m, in, out, 1.0f, g.data_ptr<float>(), out, w.data_ptr<float>(), in, 0.0f,
                    gx.data_ptr<float>(), in);
      }
      gx = gx.view(shape);
    }
    if (ctx->needs_input_grad(1)) {
      gw = at::empty({out, in}, w.options());
      if (m == 0) {
        gw.zero_();
      } else if (out > 0 && in > 0) {
        RECORD_FUNCTION("cohort::linear_grad_weight", std::vector<c10::IValue>({g, x2}));
        oneDnnSgemm(true, false, out, in, m, 1.0f, g.data_ptr<float>(), out, x2.data_ptr<float>(), in, 0.0f,
                    gw.data_ptr<float>(), in);
      }
    }
    return {gx, gw, gb, at::Tensor()};
  }
};

// Whether the bias of a product under CPU autocast goes through the
// bfloat16 kernels: a float32 bias on the CPU, the product bfloat16, an
// input of more than 2 dimensions (LibTorch's C++ linear adds the float32
// bias to its bfloat16 product there, output += bias; a 2-D input takes
// addmm, which autocast casts the bias for).
bool bf16BiasTakes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() && x.dim() > 2 && at::autocast::is_cpu_enabled() &&
         at::autocast::get_autocast_cpu_dtype() == at::kBFloat16 && !at::autocast::is_enabled() &&
         x.device().is_cpu() && weight.device().is_cpu() && bias.device().is_cpu() && bias.dim() == 1 &&
         bias.scalar_type() == at::kFloat && bias.layout() == at::kStrided && weight.dim() == 2 &&
         bias.size(0) == weight.size(0);
}

// y += bias on each row, y a contiguous bfloat16 product [..., n], the
// float32 bias: in place.
void addBiasBf16(at::Tensor& y, const at::Tensor& bias) {
  const at::Tensor b = bias.contiguous();
  const int64_t n = b.size(0);
  detail::addToRowsBf16(y.data_ptr<c10::BFloat16>(), b.data_ptr<float>(), n == 0 ? 0 : y.numel() / n, n);
}

class Bf16BiasFunction : public torch::autograd::Function<Bf16BiasFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, at::Tensor y, const at::Tensor& bias) {
    addBiasBf16(y, bias);
    ctx->mark_dirty({y});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const int64_t n = g.size(-1);
    at::Tensor gb;
    if (!ctx->needs_input_grad(1)) return {g, gb};
    if (torch::GradMode::is_enabled()) {
      // The graph of the gradients is kept (double backward): ATen's sum.
      gb = g.reshape({-1, n}).sum(0).to(at::kFloat);
    } else {
      const at::Tensor gc = g.contiguous();
      gb = at::empty({n}, gc.options().dtype(at::kFloat));
      detail::columnSumsBf16(gc.data_ptr<c10::BFloat16>(), gb.data_ptr<float>(), n == 0 ? 0 : gc.numel() / n, n);
    }
    return {g, gb};
  }
};

// The product in LibTorch (autocast's bfloat16), then the bias.
at::Tensor linearBf16Bias(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  at::Tensor y = torch::nn::functional::linear(x, weight);
  if (y.scalar_type() != at::kBFloat16 || !y.is_contiguous() || y.dim() == 0 || y.size(-1) != bias.size(0)) {
    return y += bias;  // what LibTorch's linear does after its product
  }
  if (torch::GradMode::is_enabled() && (y.requires_grad() || bias.requires_grad())) {
    return Bf16BiasFunction::apply(y, bias);
  }
  addBiasBf16(y, bias);
  return y;
}

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // LibTorch's nn::Linear computes it so (a product, then the bias added in
  // place; at::linear fuses the bias into the product for some shapes and
  // rounds otherwise under autocast): the same numbers as the modules.
  if (bf16BiasTakes(x, weight, bias)) return linearBf16Bias(x, weight, bias);
  if (!takesOneDnn(x, weight, bias)) return torch::nn::functional::linear(x, weight, bias);
  oneDnnCalls.fetch_add(1, std::memory_order_relaxed);
  const bool grads = torch::GradMode::is_enabled() &&
                     (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (!grads) {
    // Inference (decoding one token at a time): no autograd node to build.
    return product(x, weight, bias);
  }
  return OneDnnLinearFunction::apply(x, weight, bias.defined() ? bias : weight.new_empty({0}), bias.defined());
}

bool oneDnnProductsTake(const at::Tensor& t) {
  if (!oneDnnLinearOn() || !at::globalContext().userEnabledMkldnn()) return false;
  if (at::autocast::is_cpu_enabled() || at::autocast::is_enabled()) return false;
  return t.device().is_cpu() && t.layout() == at::kStrided && t.scalar_type() == at::kFloat && !t.is_quantized() &&
         !t.is_conj() && !t.is_neg();
}

bool oneDnnLinearOn() {
  static const bool on = !env::linearGemmAten();
  return on;
}

std::string linearGemmDescription() {
  if (env::linearGemmAten()) return "aten (COHORT_GEMM)";
  if (!at::globalContext().userEnabledMkldnn()) return "aten (compute.onednn off)";
  return env::linearForwardNt() ? "onednn, (N, T) forward (COHORT_GEMM)" : "onednn";
}

int64_t oneDnnLinearCalls() { return oneDnnCalls.load(std::memory_order_relaxed); }

namespace detail {

at::Tensor weightProduct(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const char* name,
                         WeightProductForm form) {
  const bool transposeFewRows = form == WeightProductForm::convolution;
  const int64_t m = x.size(0), in = x.size(1), out = weight.size(0);
  at::Tensor y = at::empty({m, out}, x.options());
  if (m == 0 || out == 0) return y;
  if (in == 0) {
    y.zero_();
  } else if (transposeFewRows && m >= 16 && m < 128) {
    RECORD_FUNCTION(name, std::vector<c10::IValue>({x, weight}));
    at::Tensor yt = at::empty({out, m}, x.options());
    oneDnnSgemm(false, true, out, m, in, 1.0f, weight.data_ptr<float>(), in, x.data_ptr<float>(), in, 0.0f,
                yt.data_ptr<float>(), m);
    y.copy_(yt.t());
  } else {
    RECORD_FUNCTION(name, std::vector<c10::IValue>({x, weight}));
    // COHORT_GEMM=onednn-nt: (N, T) at every size, to compare the forms.
    static const bool ntOnly = env::linearForwardNt();
    if (form == WeightProductForm::linear && m >= kRowsForTransposedWeight && !ntOnly) {
      const at::Tensor wt = weight.t().contiguous();
      oneDnnSgemm(false, false, m, out, in, 1.0f, x.data_ptr<float>(), in, wt.data_ptr<float>(), out, 0.0f,
                  y.data_ptr<float>(), out);
    } else {
      oneDnnSgemm(false, true, m, out, in, 1.0f, x.data_ptr<float>(), in, weight.data_ptr<float>(), in, 0.0f,
                  y.data_ptr<float>(), out);
    }
  }
  if (bias.defined()) {
    const at::Tensor b = bias.contiguous();
    addToRows<float>(y.data_ptr<float>(), b.data_ptr<float>(), m, out);
  }
  return y;
}

at::Tensor biasGradient(const at::Tensor& g) {
  const at::ScalarType t = g.scalar_type();
  // A gradient whose graph is kept (double backward) differentiates through ATen's sum.
  if ((torch::GradMode::is_enabled() && g.requires_grad()) || g.dim() != 2 || !g.device().is_cpu() ||
      g.layout() != at::kStrided || (t != at::kFloat && t != at::kDouble)) {
    return g.sum(0);
  }
  const at::Tensor gc = g.contiguous();
  at::Tensor out = at::empty({g.size(1)}, g.options());
  if (t == at::kFloat) {
    columnSums<float>(gc.data_ptr<float>(), out.data_ptr<float>(), g.size(0), g.size(1));
  } else {
    columnSums<double>(gc.data_ptr<double>(), out.data_ptr<double>(), g.size(0), g.size(1));
  }
  return out;
}

}  // namespace detail

}  // namespace cohort::models
