// The fused training ops (src/models/fused_ops.h) against the ATen ops they
// replace, forward and backward, on shapes and values the input picks.
//
// Input: byte 0 the op (bias+GELU, add+LayerNorm, BatchNorm+ReLU, a linear
// layer's bias: models/linear.h through oneDNN, its bias added to the rows
// and its gradient summed over them by the fused kernels, or with the
// float64 flag under bfloat16 autocast; add+LayerNorm with the tanh flag in
// float32 takes a bfloat16 delta under autocast), byte 1
// flags (float64, non-contiguous or channels-last, GELU's tanh, a bias),
// bytes 2-5 the sizes (each from 1, 2, 3, 5, 7, 8, 9, 16, 17, 31), the rest
// the values, in [-4, 4) by 1/32, repeated to fill. The reference is the
// ATen ops in float64 on the same values; a fused value or gradient off by
// more than tol * (1 + |reference|) (float32: 1e-4, float64: 1e-9), plus in
// float32 for the gradients four times the float32 ATen ops' own error, is
// a finding, as is any exception but BatchNorm's refusal of one value per
// channel, which ATen refuses alike.

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "fuzz_tensor.h"
#include "fuzz_util.h"
#include "cohort/models/linear.h"
#include "models/fused_ops.h"

namespace {

constexpr int64_t kSizes[] = {1, 2, 3, 5, 7, 8, 9, 16, 17, 31};

struct Input {
  const uint8_t* data;
  size_t size;
  size_t next = 0;
  int64_t dim() { return kSizes[(next < size ? data[next++] : 0) % 10]; }
};

using cohort::fuzz::inputValues;

// t (float64) as the fused op's input: `dtype`, made non-contiguous (a
// strided view of a wider tensor) or channels-last when asked.
at::Tensor asInput(const at::Tensor& t, at::ScalarType dtype, int layout) {
  at::Tensor r;
  if (layout == 1 && t.dim() >= 1) {
    std::vector<int64_t> wide = t.sizes().vec();
    wide.back() *= 2;
    r = torch::zeros(wide, dtype).slice(-1, 0, wide.back(), 2);
    r.copy_(t);
  } else if (layout == 2 && t.dim() == 4) {
    r = t.to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
  } else {
    r = t.to(dtype);
  }
  return r.detach().requires_grad_(true);
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// got (the fused op's) against want (float64 ATen's): within
// tol * (1 + |want|), plus in float32 four times the largest error of the
// float32 ATen ops on the same values (`aten`), which is what the
// problem's conditioning allows (LayerNorm's and BatchNorm's gradients
// scale with 1 / std: nearly constant rows amplify rounding). A value
// that is a sum of many terms (`sums`: the sum of their magnitudes, per
// element) may also be off by what summing them in float costs in the
// worst case: the kernels' float accumulators add at most 1024 values
// before moving into a double (models/detail/fused_kernels_impl.h), each
// addition rounding by at most 2^-24 of the running sum, so 1024 * 2^-24
// of the magnitudes (in float64 its 2^-53). A sum that cancels to near 0
// is then checked against the size of its terms, not of its result.
void compare(const at::Tensor& got, const at::Tensor& want, double tol, const std::string& what,
             const at::Tensor& aten = {}, const at::Tensor& sums = {}) {
  cohort::fuzz::require(got.defined() && want.defined() && got.sizes() == want.sizes(), what + ": shape");
  const at::Tensor g = got.detach().to(torch::kDouble), w = want.detach().to(torch::kDouble);
  double allowance = 0;
  if (aten.defined() && w.numel() > 0) {
    allowance = 4 * (aten.detach().to(torch::kDouble) - w).abs().max().item<double>();
  }
  at::Tensor excess = (g - w).abs() - tol * (1 + w.abs()) - allowance;
  if (sums.defined()) {
    const double unit = got.scalar_type() == at::kDouble ? 0x1p-53 : 0x1p-24;
    excess = excess - 1024 * unit * sums.to(torch::kDouble);
  }
  if (excess.numel() > 0 && excess.max().item<double>() > 0) {
    cohort::fuzz::finding(what + " off by " + std::to_string((g - w).abs().max().item<double>()) +
                          " (float32 ATen: " + std::to_string(allowance / 4) + ")");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace models = cohort::models;
  if (size < 2) return 0;
  static const bool once = [] {
    at::set_num_threads(1);
    return true;
  }();
  (void)once;
  const int op = data[0] % 4;
  const uint8_t flags = data[1];
  const at::ScalarType dtype = (flags & 1) ? at::kDouble : at::kFloat;
  const double tol = dtype == at::kDouble ? 1e-9 : 1e-4;
  const int layout = (flags >> 1) % 3;  // contiguous, strided, channels-last
  const bool tanh = (flags & 8) != 0, bias = (flags & 16) != 0;
  Input in{data, size, 2};
  const size_t v = 6;  // values from here on
  if (op == 0) {
    const int64_t rows = in.dim(), n = in.dim();
    const at::Tensor h = inputValues(data, size, v, {rows, n}), b = inputValues(data, size, v + 3, {n});
    at::Tensor hf = asInput(h, dtype, layout), hr = leaf(h);
    at::Tensor bf = bias ? asInput(b, dtype, 0) : at::Tensor(), br = bias ? leaf(b) : at::Tensor();
    at::Tensor y = models::detail::biasGeluFused(hf, bf, tanh);
    at::Tensor want = torch::gelu(bias ? hr + br : hr, tanh ? "tanh" : "none");
    compare(y, want, tol, "bias+gelu");
    const at::Tensor g = inputValues(data, size, v + 1, {rows, n});
    y.backward(g.to(dtype));
    want.backward(g);
    compare(hf.grad(), hr.grad(), tol, "bias+gelu dh");
    if (bias) compare(bf.grad(), br.grad(), tol, "bias+gelu db");
  } else if (op == 1) {
    const int64_t rows = in.dim(), n = in.dim();
    const at::Tensor x = inputValues(data, size, v, {rows, n}), d = inputValues(data, size, v + 5, {rows, n});
    const at::Tensor w = inputValues(data, size, v + 2, {n}), b = inputValues(data, size, v + 7, {n});
    // With the tanh flag in float32: under bf16 autocast, a bfloat16 delta
    // (models::addLayerNorm widens it), against float64 on its values.
    const bool branch = tanh && dtype == at::kFloat;
    const at::Tensor dv = branch ? d.to(at::kBFloat16).to(torch::kDouble) : d;
    at::Tensor xf = asInput(x, dtype, layout), wf = asInput(w, dtype, 0);
    at::Tensor df = asInput(dv, branch ? at::kBFloat16 : dtype, layout);
    at::Tensor bf = bias ? asInput(b, dtype, 0) : at::Tensor();
    at::Tensor xr = leaf(x), dr = leaf(dv), wr = leaf(w), br = bias ? leaf(b) : at::Tensor();
    models::AddNorm got;
    if (branch) {
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      try {
        got = models::addLayerNorm(xf, df, wf, bf, 1e-5);
      } catch (...) {
        at::autocast::set_cpu_enabled(false);
        throw;
      }
      at::autocast::set_cpu_enabled(false);
      at::autocast::clear_cache();
    } else {
      got = models::detail::addLayerNormFused(xf, df, wf, bf, 1e-5);
    }
    const at::Tensor s = xr + dr, y = torch::layer_norm(s, {n}, wr, br, 1e-5);
    compare(got.sum, s, tol, "add+layer_norm s");
    compare(got.norm, y, tol, "add+layer_norm y");
    const at::Tensor gs = inputValues(data, size, v + 3, {rows, n}), gy = inputValues(data, size, v + 4, {rows, n});
    ((got.sum * gs.to(dtype)).sum() + (got.norm * gy.to(dtype)).sum()).backward();
    ((s * gs).sum() + (y * gy).sum()).backward();
    // The float32 ATen ops on the same values, for their error (compare()).
    at::Tensor xa, da, wa, ba;
    if (dtype == at::kFloat) {
      xa = asInput(x, dtype, 0), da = asInput(dv, dtype, 0), wa = asInput(w, dtype, 0);
      ba = bias ? asInput(b, dtype, 0) : at::Tensor();
      const at::Tensor sa = xa + da, ya = torch::layer_norm(sa, {n}, wa, ba, 1e-5);
      ((sa * gs.to(dtype)).sum() + (ya * gy.to(dtype)).sum()).backward();
    }
    auto gradOf = [](const at::Tensor& t) { return t.defined() ? t.grad() : at::Tensor(); };
    compare(xf.grad(), xr.grad(), tol, "add+layer_norm dx", gradOf(xa));
    // A bfloat16 delta's gradient is rounded to 8 bits.
    compare(df.grad(), dr.grad(), branch ? 1.0 / 128 : tol, "add+layer_norm ddelta", gradOf(da));
    compare(wf.grad(), wr.grad(), tol, "add+layer_norm dweight", gradOf(wa));
    if (bias) compare(bf.grad(), br.grad(), tol, "add+layer_norm dbias", gradOf(ba));
  } else if (op == 3 && (flags & 1)) {
    // Under bfloat16 autocast, a 3-D input (models/linear.h): LibTorch's
    // product and cohort's bias give LibTorch's linear bitwise, and the
    // same input and weight gradients; the float32 bias's gradient is the
    // float32 sum of the bfloat16 output gradient.
    const int64_t rows = in.dim() * in.dim(), din = in.dim(), dout = in.dim();
    const at::Tensor x = inputValues(data, size, v, {1, rows, din}), w = inputValues(data, size, v + 1, {dout, din});
    const at::Tensor b = inputValues(data, size, v + 2, {dout});
    const at::Tensor g = inputValues(data, size, v + 3, {1, rows, dout}).to(at::kBFloat16);
    const int xl = layout == 1 ? 1 : 0;
    at::Tensor xf = asInput(x, at::kFloat, xl), wf = asInput(w, at::kFloat, 0), bf = asInput(b, at::kFloat, xl);
    at::Tensor xa = asInput(x, at::kFloat, xl), wa = asInput(w, at::kFloat, 0), ba = asInput(b, at::kFloat, xl);
    at::Tensor y, want;
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    try {
      y = models::linear(xf, wf, bf);
      want = torch::nn::functional::linear(xa, wa, ba);
    } catch (...) {
      at::autocast::set_cpu_enabled(false);
      at::autocast::clear_cache();
      throw;
    }
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
    cohort::fuzz::require(y.scalar_type() == at::kBFloat16 && torch::equal(y, want), "bf16 linear y is not LibTorch's");
    y.backward(g);
    want.backward(g);
    cohort::fuzz::require(torch::equal(xf.grad(), xa.grad()), "bf16 linear dx is not LibTorch's");
    cohort::fuzz::require(torch::equal(wf.grad(), wa.grad()), "bf16 linear dw is not LibTorch's");
    const at::Tensor gd = g.to(torch::kDouble).reshape({rows, dout});
    compare(bf.grad(), gd.sum(0), 1e-6, "bf16 linear db", {}, gd.abs().sum(0));
  } else if (op == 3) {
    // Rows up to 31 x 31: several of the column sums' blocks of 64. The
    // linear layer takes float32 only (float64 goes to ATen's).
    const int64_t rows = in.dim() * in.dim(), din = in.dim(), dout = in.dim();
    const at::Tensor x = inputValues(data, size, v, {rows, din}), w = inputValues(data, size, v + 1, {dout, din});
    const at::Tensor b = inputValues(data, size, v + 2, {dout}), g = inputValues(data, size, v + 3, {rows, dout});
    at::Tensor xf = asInput(x, at::kFloat, layout == 1 ? 1 : 0), wf = asInput(w, at::kFloat, 0);
    at::Tensor bf = asInput(b, at::kFloat, layout == 1 ? 1 : 0);
    at::Tensor xr = leaf(x), wr = leaf(w), br = leaf(b);
    at::Tensor y = models::linear(xf, wf, bf);
    const at::Tensor want = torch::nn::functional::linear(xr, wr, br);
    at::Tensor xa = asInput(x, at::kFloat, 0), wa = asInput(w, at::kFloat, 0), ba = asInput(b, at::kFloat, 0);
    const at::Tensor ya = torch::nn::functional::linear(xa, wa, ba);
    compare(y, want, 1e-4, "linear y", ya);
    y.backward(g.to(at::kFloat));
    want.backward(g);
    ya.backward(g.to(at::kFloat));
    compare(xf.grad(), xr.grad(), 1e-4, "linear dx", xa.grad());
    compare(wf.grad(), wr.grad(), 1e-4, "linear dw", wa.grad());
    compare(bf.grad(), br.grad(), 1e-4, "linear db", ba.grad(), g.abs().sum(0));
  } else {
    const int64_t n = in.dim(), c = in.dim(), h = in.dim(), w = in.dim();
    const at::Tensor x = inputValues(data, size, v, {n, c, h, w});
    const at::Tensor wt = inputValues(data, size, v + 1, {c}), b = inputValues(data, size, v + 2, {c});
    at::Tensor xf = asInput(x, dtype, layout), wf = asInput(wt, dtype, 0), bf = asInput(b, dtype, 0);
    at::Tensor xr = leaf(x), wr = leaf(wt), br = leaf(b);
    at::Tensor rm = torch::zeros({c}, dtype), rv = torch::ones({c}, dtype);
    at::Tensor rmr = torch::zeros({c}, torch::kDouble), rvr = torch::ones({c}, torch::kDouble);
    if (n * h * w == 1) {
      bool refused = false;
      try {
        models::detail::batchNormReluFused(xf, wf, bf, rm, rv, 0.1, 1e-5);
      } catch (const c10::Error&) {
        refused = true;
      }
      cohort::fuzz::require(refused, "batch norm of one value per channel was not refused");
      return 0;
    }
    at::Tensor y = models::detail::batchNormReluFused(xf, wf, bf, rm, rv, 0.1, 1e-5);
    at::Tensor want = torch::relu(torch::batch_norm(xr, wr, br, rmr, rvr, true, 0.1, 1e-5, false));
    // Where x * scale + shift is within rounding of 0, float32 and float64
    // may disagree on the ReLU: compare only away from it. The rounding
    // scales with the terms' size: a channel of nearly equal values has a
    // large 1 / std, and x * scale and shift are then large and cancel.
    const at::Tensor pre = torch::batch_norm(xr.detach(), wr.detach(), br.detach(), {}, {}, true, 0.1, 1e-5, false);
    const at::Tensor mu = x.mean({0, 2, 3}), sd = (x.var({0, 2, 3}, /*unbiased=*/false) + 1e-5).rsqrt();
    const at::Tensor sc = (wt * sd).view({1, c, 1, 1});
    const at::Tensor terms = (x * sc).abs() + (mu.view({1, c, 1, 1}) * sc).abs() + b.abs().view({1, c, 1, 1});
    const at::Tensor clear = (pre.abs() > (dtype == at::kDouble ? 1e-9 : 1e-5) * (1 + terms)).to(torch::kDouble);
    compare(y.to(torch::kDouble) * clear, want * clear, tol, "bn+relu y");
    compare(rm, rmr, tol, "bn running mean");
    compare(rv, rvr, tol, "bn running var");
    if (clear.min().item<double>() < 1) return 0;  // a mask in doubt: its gradients may differ anywhere
    const at::Tensor g = inputValues(data, size, v + 3, {n, c, h, w});
    y.backward(g.to(dtype));
    want.backward(g);
    at::Tensor xa, wa, ba;
    if (dtype == at::kFloat) {
      xa = asInput(x, dtype, 0), wa = asInput(wt, dtype, 0), ba = asInput(b, dtype, 0);
      at::Tensor rma = torch::zeros({c}, dtype), rva = torch::ones({c}, dtype);
      torch::relu(torch::batch_norm(xa, wa, ba, rma, rva, true, 0.1, 1e-5, false)).backward(g.to(dtype));
    }
    auto gradOf = [](const at::Tensor& t) { return t.defined() ? t.grad() : at::Tensor(); };
    compare(xf.grad(), xr.grad(), tol, "bn+relu dx", gradOf(xa));
    // The weight's and bias's gradients sum g (x - mean) / std and g over
    // the channel's n h w values where the ReLU passes.
    const at::Tensor passed = g * (pre > 0).to(torch::kDouble);
    const at::Tensor centred = (x - mu.view({1, c, 1, 1})) * sd.view({1, c, 1, 1});
    compare(wf.grad(), wr.grad(), tol, "bn+relu dweight", gradOf(wa), (passed * centred).abs().sum({0, 2, 3}));
    compare(bf.grad(), br.grad(), tol, "bn+relu dbias", gradOf(ba), passed.abs().sum({0, 2, 3}));
  }
  return 0;
}
