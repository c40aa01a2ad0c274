#include "models/fused_ops.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <atomic>
#include <utility>

#include "cohort/core/env.h"
#include "models/fused_kernels.h"

namespace cohort::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// CPU autocast off for the scope, as it was after it.
struct AutocastOff {
  AutocastOff() : was_(at::autocast::is_cpu_enabled()) { at::autocast::set_cpu_enabled(false); }
  ~AutocastOff() { at::autocast::set_cpu_enabled(was_); }
  bool was_;
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;
};

std::atomic<int64_t> fusedCalls{0};
thread_local int fusedScope = -1;  // -1: fusedOpsByDefault(); else the innermost FusedOpsScope's

// f(T{}) with T the tensors' element type (float or double).
template <typename F>
void byDtype(const at::Tensor& t, F f) {
  if (t.scalar_type() == at::kFloat) {
    f(float{});
  } else {
    TORCH_CHECK(t.scalar_type() == at::kDouble, "fused ops: float32 or float64, got ", t.scalar_type());
    f(double{});
  }
}

template <typename T>
const T* ptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <typename T>
T* mutablePtr(at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

void checkTaken(std::initializer_list<at::Tensor> tensors, const char* op) {
  TORCH_CHECK(detail::fusedKernelsTake(tensors), op,
              ": the fused kernels take CPU tensors of float32 or float64, of one dtype, autocast off");
}

// gelu(h + bias) (bias may be undefined) and, with `slope`, gelu'(h + bias),
// in one pass: {y, slope or undefined}.
std::pair<at::Tensor, at::Tensor> geluPass(const at::Tensor& h, const at::Tensor& bias, bool tanh, bool slope) {
  const at::Tensor hc = h.contiguous();
  const at::Tensor bc = bias.defined() ? bias.contiguous() : at::Tensor();
  at::Tensor y = at::empty_like(hc, at::MemoryFormat::Contiguous);
  at::Tensor s = slope ? at::empty_like(hc, at::MemoryFormat::Contiguous) : at::Tensor();
  const int64_t n = hc.dim() == 0 ? 1 : hc.size(-1), rows = n == 0 ? 0 : hc.numel() / n;
  if (hc.scalar_type() == at::kBFloat16) {  // no bias (detail::geluBf16Takes)
    detail::geluForwardBf16(hc.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(),
                            s.defined() ? s.data_ptr<c10::BFloat16>() : nullptr, hc.numel(), tanh);
    return {y, s};
  }
  byDtype(hc, [&](auto tag) {
    using T = decltype(tag);
    detail::biasGeluForward<T>(ptr<T>(hc), ptr<T>(bc), mutablePtr<T>(y), mutablePtr<T>(s), rows, n, tanh);
  });
  return {y, s};
}

// Keeps gelu'(h + b) from the forward pass (the size of the h it replaces
// among the saved tensors): the backward is one product, no erf or exp.
class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const c10::optional<at::Tensor>& bias,
                            bool tanh) {
    const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
    auto [y, slope] = geluPass(h, b, tanh, /*slope=*/true);
    ctx->save_for_backward({slope});
    ctx->saved_data["bias"] = b.defined();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor slope = ctx->get_saved_variables()[0];
    const at::Tensor gy = grads[0].contiguous();
    at::Tensor gh = at::empty_like(slope, at::MemoryFormat::Contiguous);
    const int64_t n = slope.dim() == 0 ? 1 : slope.size(-1), rows = n == 0 ? 0 : slope.numel() / n;
    at::Tensor gb = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(1) ? at::empty({n}, slope.options())
                                                                                  : at::Tensor();
    if (slope.scalar_type() == at::kBFloat16) {
      const at::Tensor g = gy.to(at::kBFloat16);
      detail::geluBackwardBf16(g.data_ptr<c10::BFloat16>(), slope.data_ptr<c10::BFloat16>(),
                               gh.data_ptr<c10::BFloat16>(), slope.numel());
      return {gh, gb, at::Tensor()};
    }
    byDtype(slope, [&](auto tag) {
      using T = decltype(tag);
      detail::biasGeluBackward<T>(ptr<T>(gy), ptr<T>(slope), mutablePtr<T>(gh), mutablePtr<T>(gb), rows, n);
    });
    if (gb.defined() && rows == 0) gb.zero_();
    return {gh, gb, at::Tensor()};
  }
};

class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, const c10::optional<at::Tensor>& bias, double eps) {
    const at::Tensor xc = x.contiguous(), dc = delta.contiguous(), wc = weight.contiguous();
    const at::Tensor bc = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
    at::Tensor s = at::empty_like(xc, at::MemoryFormat::Contiguous);
    at::Tensor y = at::empty_like(xc, at::MemoryFormat::Contiguous);
    const int64_t n = wc.numel(), rows = n == 0 ? 0 : xc.numel() / n;
    at::Tensor mean = at::empty({rows}, xc.options());
    at::Tensor rstd = at::empty({rows}, xc.options());
    byDtype(xc, [&](auto tag) {
      using T = decltype(tag);
      detail::addLayerNormForward<T>(ptr<T>(xc), ptr<T>(dc), ptr<T>(wc), ptr<T>(bc), mutablePtr<T>(s),
                                     mutablePtr<T>(y), mutablePtr<T>(mean), mutablePtr<T>(rstd), rows, n, eps);
    });
    ctx->save_for_backward({s, wc});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["rstd"] = rstd;
    ctx->saved_data["bias"] = bc.defined();
    return {s, y};
  }

  // grads: of s and of layer_norm(s) (zeros where an output went unused).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& s = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor mean = ctx->saved_data["mean"].toTensor();
    const at::Tensor rstd = ctx->saved_data["rstd"].toTensor();
    const at::Tensor gs = grads[0].contiguous(), gy = grads[1].contiguous();
    at::Tensor gx = at::empty_like(s, at::MemoryFormat::Contiguous);
    at::Tensor gw = ctx->needs_input_grad(2) ? at::empty_like(w) : at::Tensor();
    at::Tensor gb = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(3) ? at::empty_like(w) : at::Tensor();
    const int64_t n = w.numel(), rows = n == 0 ? 0 : s.numel() / n;
    byDtype(s, [&](auto tag) {
      using T = decltype(tag);
      detail::addLayerNormBackward<T>(ptr<T>(gs), ptr<T>(gy), ptr<T>(s), ptr<T>(mean), ptr<T>(rstd), ptr<T>(w),
                                      mutablePtr<T>(gx), mutablePtr<T>(gw), mutablePtr<T>(gb), rows, n);
    });
    if (rows == 0) {
      if (gw.defined()) gw.zero_();
      if (gb.defined()) gb.zero_();
    }
    // x + delta: both get the same gradient, as add's backward gives.
    return {gx, gx, gw, gb, at::Tensor()};
  }
};

detail::BnShape bnShape(const at::Tensor& x, bool channelsLast) {
  detail::BnShape sh;
  sh.n = x.size(0);
  sh.c = x.size(1);
  sh.hw = x.size(2) * x.size(3);
  sh.channelsLast = channelsLast;
  return sh;
}

class BatchNormReluFunction : public torch::autograd::Function<BatchNormReluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const c10::optional<at::Tensor>& runningMean,
                            const c10::optional<at::Tensor>& runningVar, double momentum, double eps) {
    // Channels-last stays channels-last (cohort picks the layout per job).
    const bool channelsLast = !x.is_contiguous() && x.is_contiguous(at::MemoryFormat::ChannelsLast);
    const at::MemoryFormat format = channelsLast ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    const at::Tensor xc = x.contiguous(format);
    const detail::BnShape sh = bnShape(xc, channelsLast);
    at::Tensor mean = at::empty({sh.c}, xc.options());
    at::Tensor var = at::empty({sh.c}, xc.options());
    byDtype(xc, [&](auto tag) {
      using T = decltype(tag);
      detail::batchNormStats<T>(ptr<T>(xc), sh, mutablePtr<T>(mean), mutablePtr<T>(var));
    });
    // Per channel, in xc's dtype: what forward and backward both use, so
    // that the backward's ReLU mask is the forward's to the bit.
    const at::Tensor invstd = var.add(eps).rsqrt_();
    const at::Tensor scale = weight.mul(invstd).contiguous();
    const at::Tensor shift = bias.sub(mean * scale).contiguous();
    at::Tensor y = at::empty_like(xc, format);
    byDtype(xc, [&](auto tag) {
      using T = decltype(tag);
      detail::batchNormReluForward<T>(ptr<T>(xc), ptr<T>(scale), ptr<T>(shift), mutablePtr<T>(y), sh);
    });
    // The running statistics as ATen's batch norm updates them, with the
    // unbiased variance.
    const double count = static_cast<double>(sh.n * sh.hw);
    if (runningMean.has_value() && runningMean->defined()) {
      runningMean->mul_(1 - momentum).add_(mean.to(runningMean->dtype()), momentum);
    }
    if (runningVar.has_value() && runningVar->defined()) {
      runningVar->mul_(1 - momentum).add_(var.to(runningVar->dtype()), momentum * count / (count - 1));
    }
    ctx->save_for_backward({xc});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["invstd"] = invstd;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["shift"] = shift;
    ctx->saved_data["channelsLast"] = channelsLast;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const bool channelsLast = ctx->saved_data["channelsLast"].toBool();
    const at::MemoryFormat format = channelsLast ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    const at::Tensor mean = ctx->saved_data["mean"].toTensor();
    const at::Tensor invstd = ctx->saved_data["invstd"].toTensor();
    const at::Tensor scale = ctx->saved_data["scale"].toTensor();
    const at::Tensor shift = ctx->saved_data["shift"].toTensor();
    const at::Tensor gy = grads[0].contiguous(format);
    const detail::BnShape sh = bnShape(x, channelsLast);
    at::Tensor gx = ctx->needs_input_grad(0) ? at::empty_like(x, format) : at::Tensor();
    at::Tensor gw = ctx->needs_input_grad(1) ? at::empty_like(mean) : at::Tensor();
    at::Tensor gb = ctx->needs_input_grad(2) ? at::empty_like(mean) : at::Tensor();
    byDtype(x, [&](auto tag) {
      using T = decltype(tag);
      detail::batchNormReluBackward<T>(ptr<T>(gy), ptr<T>(x), ptr<T>(mean), ptr<T>(invstd), ptr<T>(scale),
                                       ptr<T>(shift), mutablePtr<T>(gx), mutablePtr<T>(gw), mutablePtr<T>(gb), sh);
    });
    return {gx, gw, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t fusedOpCalls() { return fusedCalls.load(std::memory_order_relaxed); }

bool fusedOpsOn() { return fusedScope < 0 ? fusedOpsByDefault() : fusedScope == 1; }

bool fusedOpsByDefault() {
  static const bool on = !env::fusedOpsOff() && std::string(detail::fusedKernelsIsa()) != "base";
  return on;
}

std::string fusedOpsDescription() {
  if (env::fusedOpsOff()) return "off (COHORT_FUSED_OPS)";
  return fusedOpsByDefault() ? detail::fusedKernelsIsa() : "off (no AVX2)";
}

FusedOpsScope::FusedOpsScope(bool on) : before_(fusedScope) { fusedScope = on ? 1 : 0; }
FusedOpsScope::~FusedOpsScope() { fusedScope = before_; }

namespace detail {

void countFusedCall() { fusedCalls.fetch_add(1, std::memory_order_relaxed); }

bool fusedKernelsTake(std::initializer_list<at::Tensor> tensors) {
  if (at::autocast::is_cpu_enabled() || at::autocast::is_enabled()) return false;
  c10::optional<at::ScalarType> dtype;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!t.device().is_cpu() || t.layout() != at::kStrided || t.is_quantized()) return false;
    if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) return false;
    if (dtype && *dtype != t.scalar_type()) return false;
    dtype = t.scalar_type();
  }
  return dtype.has_value();
}

at::Tensor biasGeluFused(const at::Tensor& h, const at::Tensor& bias, bool tanh) {
  checkTaken({h, bias}, "biasGelu");
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && h.dim() >= 1 && h.size(-1) == bias.size(0)),
              "biasGelu: h [..., n] and bias [n] or none, got ", h.sizes(), " and ", bias.sizes());
  fusedCalls.fetch_add(1, std::memory_order_relaxed);
  const bool keep = at::GradMode::is_enabled() && (h.requires_grad() || (bias.defined() && bias.requires_grad()));
  // Without a gradient to keep: the values alone, no slope, no autograd node.
  if (!keep) return geluPass(h, bias, tanh, /*slope=*/false).first;
  const c10::optional<at::Tensor> b = bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
  return BiasGeluFunction::apply(h, b, tanh);
}

bool geluBf16Takes(const at::Tensor& h, const at::Tensor& bias) {
  return !bias.defined() && h.defined() && h.device().is_cpu() && h.layout() == at::kStrided &&
         h.scalar_type() == at::kBFloat16;
}

at::Tensor geluBf16Fused(const at::Tensor& h, bool tanh) {
  TORCH_CHECK(geluBf16Takes(h, {}), "gelu: the fused bfloat16 path takes a CPU tensor of bfloat16, got ",
              h.scalar_type(), " on ", h.device());
  fusedCalls.fetch_add(1, std::memory_order_relaxed);
  if (!(at::GradMode::is_enabled() && h.requires_grad())) return geluPass(h, {}, tanh, /*slope=*/false).first;
  return BiasGeluFunction::apply(h, c10::nullopt, tanh);
}

AddNorm addLayerNormFused(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                          const at::Tensor& bias, double eps) {
  checkTaken({x, delta, weight, bias}, "addLayerNorm");
  TORCH_CHECK(x.sizes() == delta.sizes() && x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0) &&
                  (!bias.defined() || bias.sizes() == weight.sizes()),
              "addLayerNorm: x and delta [..., n], weight and bias [n], got ", x.sizes(), ", ", delta.sizes(), ", ",
              weight.sizes());
  fusedCalls.fetch_add(1, std::memory_order_relaxed);
  // An absent tensor goes in as nullopt: autograd takes no undefined tensor as an input.
  const c10::optional<at::Tensor> b = bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
  const variable_list out = AddLayerNormFunction::apply(x, delta, weight, b, eps);
  return {out[0], out[1]};
}

at::Tensor batchNormReluFused(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const at::Tensor& runningMean, const at::Tensor& runningVar, double momentum,
                              double eps) {
  checkTaken({x, weight, bias}, "batchNormRelu");
  TORCH_CHECK(x.dim() == 4 && weight.defined() && bias.defined() && weight.dim() == 1 &&
                  weight.size(0) == x.size(1) && bias.sizes() == weight.sizes(),
              "batchNormRelu: x [N, C, H, W], weight and bias [C], got ", x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(x.size(0) * x.size(2) * x.size(3) > 1,
              "Expected more than 1 value per channel when training, got input size ", x.sizes());
  fusedCalls.fetch_add(1, std::memory_order_relaxed);
  auto maybe = [](const at::Tensor& t) { return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt; };
  return BatchNormReluFunction::apply(x, weight, bias, maybe(runningMean), maybe(runningVar), momentum, eps);
}

}  // namespace detail

at::Tensor biasGelu(const at::Tensor& h, const at::Tensor& bias, bool tanh) {
  if (fusedOpsOn() && detail::geluBf16Takes(h, bias)) return detail::geluBf16Fused(h, tanh);
  if (!fusedOpsOn() || !detail::fusedKernelsTake({h, bias})) {
    return torch::gelu(bias.defined() ? h + bias : h, tanh ? "tanh" : "none");
  }
  return detail::biasGeluFused(h, bias, tanh);
}

namespace {

// Under CPU autocast to bfloat16, a float32 residual stream x and a
// bfloat16 branch delta (a linear layer's output), the LayerNorm's
// parameters float32 (autocast runs layer_norm in float32).
bool residualUnderBf16Autocast(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                               const at::Tensor& bias) {
  if (!at::autocast::is_cpu_enabled() || at::autocast::is_enabled() ||
      at::autocast::get_autocast_cpu_dtype() != at::kBFloat16 || delta.scalar_type() != at::kBFloat16 ||
      !delta.device().is_cpu() || delta.layout() != at::kStrided) {
    return false;
  }
  AutocastOff off;
  return detail::fusedKernelsTake({x, weight, bias}) && x.scalar_type() == at::kFloat;
}

}  // namespace

AddNorm addLayerNorm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, const at::Tensor& bias,
                     double eps) {
  if (fusedOpsOn() && x.sizes() == delta.sizes() && residualUnderBf16Autocast(x, delta, weight, bias)) {
    // ATen adds them through a float32 copy of delta (type promotion) and
    // then takes layer_norm in float32: the same sum here, delta widened
    // (exactly), and the float32 fused op. Its gradient goes back to delta
    // through the widening, rounded to bfloat16 as add's would be.
    AutocastOff off;
    return detail::addLayerNormFused(x, delta.to(at::kFloat), weight, bias, eps);
  }
  if (!fusedOpsOn() || !detail::fusedKernelsTake({x, delta, weight, bias}) || x.sizes() != delta.sizes()) {
    at::Tensor s = x + delta;
    at::Tensor y = torch::layer_norm(s, {weight.size(0)}, weight, bias, eps);
    return {s, y};
  }
  return detail::addLayerNormFused(x, delta, weight, bias, eps);
}

at::Tensor batchNormRelu(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x) {
  const auto& o = bn.options;
  if (!fusedOpsOn() || !bn.is_training() || !o.affine() || !o.track_running_stats() || x.dim() != 4 ||
      x.size(0) * x.size(2) * x.size(3) <= 1 ||
      !detail::fusedKernelsTake({x, bn.weight, bn.bias, bn.running_mean, bn.running_var})) {
    return torch::relu(bn.forward(x));
  }
  // As BatchNormImplBase::forward: the count of batches, and without a
  // momentum a cumulative average.
  double factor = o.momentum().value_or(0.0);
  if (bn.num_batches_tracked.defined()) {
    torch::NoGradGuard noGrad;
    bn.num_batches_tracked += 1;
    if (!o.momentum()) factor = 1.0 / bn.num_batches_tracked.item<double>();
  }
  return detail::batchNormReluFused(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, factor, o.eps());
}

}  // namespace cohort::models
