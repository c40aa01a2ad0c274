#include "models/gemm_conv.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <vector>

#include "cohort/core/sgemm.h"
#include "cohort/models/linear.h"
#include "models/detail/weight_product.h"

namespace cohort::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<int64_t> gemmCalls{0};

// The shapes of one call. tapsLast: the unfolded columns (and the weight's
// memory) run (kh, kw, C); otherwise (C, kh, kw).
struct Geometry {
  int64_t n = 0, c = 0, h = 0, w = 0, out = 0, kh = 0, kw = 0, sh = 0, sw = 0, ph = 0, pw = 0, oh = 0, ow = 0;
  bool tapsLast = false;

  int64_t rows() const { return n * oh * ow; }
  int64_t taps() const { return c * kh * kw; }
  // The input itself, seen as [N x H x W, C], is the unfolded input.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }

  std::vector<int64_t> pack() const { return {n, c, h, w, out, kh, kw, sh, sw, ph, pw, oh, ow, tapsLast ? 1 : 0}; }
  static Geometry unpack(const std::vector<int64_t>& v) {
    Geometry g;
    int64_t* fields[] = {&g.n, &g.c, &g.h, &g.w, &g.out, &g.kh, &g.kw, &g.sh, &g.sw, &g.ph, &g.pw, &g.oh, &g.ow};
    for (size_t k = 0; k < 13; ++k) *fields[k] = v.at(k);
    g.tapsLast = v.at(13) != 0;
    return g;
  }
};

// The shapes of conv(x) when the rule takes it; productsTakeConvolution
// must hold.
bool geometryOf(const torch::nn::Conv2dImpl& conv, const at::Tensor& x, Geometry* g) {
  const auto& o = conv.options;
  const auto& pad = c10::get<torch::ExpandingArray<2>>(o.padding());
  const auto k = o.kernel_size(), s = o.stride();
  const at::Tensor& weight = conv.weight;
  if (weight.dim() != 4 || x.size(1) != weight.size(1)) return false;
  if (weight.is_contiguous()) {
    g->tapsLast = false;
  } else if (weight.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    g->tapsLast = true;
  } else {
    return false;
  }
  g->n = x.size(0);
  g->c = x.size(1);
  g->h = x.size(2);
  g->w = x.size(3);
  g->out = weight.size(0);
  g->kh = k->at(0);
  g->kw = k->at(1);
  g->sh = s->at(0);
  g->sw = s->at(1);
  g->ph = pad->at(0);
  g->pw = pad->at(1);
  const int64_t spanH = g->h + 2 * g->ph - g->kh, spanW = g->w + 2 * g->pw - g->kw;
  if (spanH < 0 || spanW < 0 || g->sh < 1 || g->sw < 1) return false;
  g->oh = spanH / g->sh + 1;
  g->ow = spanW / g->sw + 1;
  // The rule: the weight is at least as large as the unfolded input. A
  // kernel of several taps must outweigh it twice, or have output rows of
  // at most 2 pixels, which oneDNN's direct kernels (they tile along the
  // row) run poorly: 3x3 to 256 channels on [8, 256, 4, 4] (128 output
  // pixels) measured level with oneDNN, on [32, 256, 2, 2] 1.3-1.5x.
  if (g->c <= 0 || g->rows() <= 0 || g->out < g->rows()) return false;
  return g->kh * g->kw == 1 || g->out > 2 * g->rows() || g->ow <= 2;
}

// The outputs [first, end) along one axis that tap `t` sees inside the input,
// and the input index the first of them reads.
struct TapRange {
  int64_t first = 0, end = 0, input = 0;
  int64_t count() const { return std::max<int64_t>(end - first, 0); }
};

TapRange tapRange(int64_t t, int64_t stride, int64_t pad, int64_t in, int64_t outs) {
  TapRange r;
  // input = o * stride - pad + t, within [0, in)
  r.first = pad > t ? (pad - t + stride - 1) / stride : 0;
  r.end = std::min(outs, (in - 1 + pad - t) / stride + 1);
  if (in - 1 + pad - t < 0) r.end = 0;
  r.input = r.first * stride - pad + t;
  return r;
}

// The unfolded columns [rows, taps] as [N, Ho, Wo, kh, kw, C] (a view).
at::Tensor tapView(const at::Tensor& cols, const Geometry& g) {
  return g.tapsLast ? cols.view({g.n, g.oh, g.ow, g.kh, g.kw, g.c})
                    : cols.view({g.n, g.oh, g.ow, g.c, g.kh, g.kw}).permute({0, 1, 2, 4, 5, 3});
}

// For each tap, the columns' block and the input's pixels it reads, both
// [N, outs H, outs W, C]; `visit(columns, input)`. Returns whether every tap
// covers every output (no padding is read).
template <typename Visit>
bool forEachTap(const at::Tensor& cols6, const at::Tensor& xl, const Geometry& g, Visit visit) {
  bool whole = true;
  for (int64_t i = 0; i < g.kh; ++i) {
    const TapRange r = tapRange(i, g.sh, g.ph, g.h, g.oh);
    for (int64_t j = 0; j < g.kw; ++j) {
      const TapRange q = tapRange(j, g.sw, g.pw, g.w, g.ow);
      whole = whole && r.count() == g.oh && q.count() == g.ow;
      if (r.count() == 0 || q.count() == 0) continue;
      visit(cols6.select(3, i).select(3, j).slice(1, r.first, r.end).slice(2, q.first, q.end),
            xl.slice(1, r.input, r.input + (r.count() - 1) * g.sh + 1, g.sh)
                .slice(2, q.input, q.input + (q.count() - 1) * g.sw + 1, g.sw));
    }
  }
  return whole;
}

bool readsPadding(const Geometry& g) {
  for (int64_t i = 0; i < g.kh; ++i) {
    if (tapRange(i, g.sh, g.ph, g.h, g.oh).count() != g.oh) return true;
  }
  for (int64_t j = 0; j < g.kw; ++j) {
    if (tapRange(j, g.sw, g.pw, g.w, g.ow).count() != g.ow) return true;
  }
  return false;
}

// x [N, C, H, W] (any strides) unfolded into dense [rows, taps].
at::Tensor unfold(const at::Tensor& x, const Geometry& g) {
  const at::Tensor xl = x.permute({0, 2, 3, 1});
  if (g.pointwise()) return xl.reshape({g.rows(), g.c}).contiguous();  // a view when x is channels-last
  at::Tensor cols = readsPadding(g) ? at::zeros({g.rows(), g.taps()}, x.options())
                                    : at::empty({g.rows(), g.taps()}, x.options());
  forEachTap(tapView(cols, g), xl, g, [](at::Tensor to, const at::Tensor& from) { to.copy_(from); });
  return cols;
}

// The columns' gradient [rows, taps] summed back onto the input's pixels.
at::Tensor fold(const at::Tensor& gcols, const Geometry& g, at::MemoryFormat format) {
  if (g.pointwise()) return gcols.view({g.n, g.h, g.w, g.c}).permute({0, 3, 1, 2}).contiguous(format);
  at::Tensor gx = at::zeros({g.n, g.c, g.h, g.w}, gcols.options().memory_format(format));
  forEachTap(tapView(gcols, g), gx.permute({0, 2, 3, 1}), g,
             [](const at::Tensor& from, at::Tensor to) { to.add_(from); });
  return gx;
}

// The weight as the [out, taps] matrix it is stored as.
at::Tensor matrixOf(const at::Tensor& weight, const Geometry& g) {
  return weight.as_strided({g.out, g.taps()}, {g.taps(), 1});
}

at::MemoryFormat formatOf(const at::Tensor& x) {
  return x.suggest_memory_format() == at::MemoryFormat::ChannelsLast ? at::MemoryFormat::ChannelsLast
                                                                       : at::MemoryFormat::Contiguous;
}

class GemmConvFunction : public torch::autograd::Function<GemmConvFunction> {
 public:
  // `bias` is an empty placeholder when !hasBias.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, bool hasBias, const std::vector<int64_t>& geometry) {
    const Geometry g = Geometry::unpack(geometry);
    const at::MemoryFormat format = formatOf(x);
    const at::Tensor cols = unfold(x, g);
    const at::Tensor y = detail::weightProduct(cols, matrixOf(weight, g), hasBias ? bias : at::Tensor(),
                                               "cohort::gemm_conv",
                                               detail::WeightProductForm::convolution);
    ctx->save_for_backward({cols, weight});
    ctx->saved_data["geometry"] = geometry;
    ctx->saved_data["bias"] = hasBias;
    ctx->saved_data["channels_last"] = format == at::MemoryFormat::ChannelsLast;
    return y.view({g.n, g.oh, g.ow, g.out}).permute({0, 3, 1, 2}).contiguous(format);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& cols = saved[0];
    const at::Tensor& weight = saved[1];
    const Geometry g = Geometry::unpack(ctx->saved_data["geometry"].toIntVector());
    const at::MemoryFormat format =
        ctx->saved_data["channels_last"].toBool() ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    // [rows, out]: a view when the gradient is channels-last.
    const at::Tensor gy = grads[0].permute({0, 2, 3, 1}).reshape({g.rows(), g.out}).contiguous();
    at::Tensor gx, gw, gb;
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) gb = detail::biasGradient(gy);
    if (ctx->needs_input_grad(0)) {
      at::Tensor gcols = at::empty({g.rows(), g.taps()}, cols.options());
      {
        RECORD_FUNCTION("cohort::gemm_conv_grad_input", std::vector<c10::IValue>({gy, matrixOf(weight, g)}));
        oneDnnSgemm(false, false, g.rows(), g.taps(), g.out, 1.0f, gy.data_ptr<float>(), g.out,
                    weight.data_ptr<float>(), g.taps(), 0.0f, gcols.data_ptr<float>(), g.taps());
      }
      gx = fold(gcols, g, format);
    }
    if (ctx->needs_input_grad(1)) {
      // Laid out as the weight is: autograd keeps it rather than copying
      // it into the weight's layout.
      gw = at::empty_strided(weight.sizes(), weight.strides(), weight.options());
      RECORD_FUNCTION("cohort::gemm_conv_grad_weight", std::vector<c10::IValue>({gy, cols}));
      oneDnnSgemm(true, false, g.out, g.taps(), g.rows(), 1.0f, gy.data_ptr<float>(), g.out, cols.data_ptr<float>(),
                  g.taps(), 0.0f, gw.data_ptr<float>(), g.taps());
    }
    return {gx, gw, gb, at::Tensor(), at::Tensor()};
  }
};

// The choices measured at start (setUnfoldedChoices) and the recording
// of candidates (recordUnfoldedCandidates).
std::mutex choicesMutex;
std::map<std::vector<int64_t>, bool> unfoldedChoices;  // under choicesMutex

struct Recording {
  std::vector<UnfoldedCandidate> candidates;
  std::set<std::vector<int64_t>> seen;
};
thread_local Recording* recording = nullptr;

// The geometry, then whether x is channels-last and whether there is a bias.
std::vector<int64_t> keyOf(const Geometry& g, bool channelsLast, bool bias) {
  std::vector<int64_t> key = g.pack();
  key.push_back(channelsLast ? 1 : 0);
  key.push_back(bias ? 1 : 0);
  return key;
}

}  // namespace

bool productsTakeConvolution(const torch::nn::Conv2dImpl& conv, const at::Tensor& x) {
  const at::Tensor& b = conv.bias;
  if (!oneDnnProductsTake(x) || !oneDnnProductsTake(conv.weight) || (b.defined() && !oneDnnProductsTake(b))) {
    return false;
  }
  const auto& o = conv.options;
  if (o.groups() != 1 || o.transposed() || o.padding_mode().index() != 0 || x.dim() != 4) return false;
  const auto d = o.dilation();
  return c10::get_if<torch::ExpandingArray<2>>(&o.padding()) != nullptr && d->at(0) == 1 && d->at(1) == 1;
}

bool gemmConvTakes(const torch::nn::Conv2dImpl& conv, const at::Tensor& x) {
  Geometry g;
  if (!productsTakeConvolution(conv, x) || !geometryOf(conv, x, &g)) return false;
  const std::vector<int64_t> key = keyOf(g, formatOf(x) == at::MemoryFormat::ChannelsLast, conv.bias.defined());
  if (recording != nullptr && recording->seen.insert(key).second) {
    recording->candidates.push_back(
        {key, fmt::format("[{},{},{},{}]{} {}x{} s{} -> {}", g.n, g.c, g.h, g.w,
                          formatOf(x) == at::MemoryFormat::ChannelsLast ? " nhwc" : "", g.kh, g.kw, g.sh, g.out)});
  }
  std::lock_guard<std::mutex> lock(choicesMutex);
  const auto chosen = unfoldedChoices.find(key);
  return chosen == unfoldedChoices.end() || chosen->second;
}

std::vector<UnfoldedCandidate> recordUnfoldedCandidates(const std::function<void()>& pass) {
  Recording r;
  Recording* const outer = recording;
  recording = &r;
  try {
    pass();
  } catch (...) {
    recording = outer;
    throw;
  }
  recording = outer;
  return std::move(r.candidates);
}

std::array<double, 2> timeUnfoldedCandidate(const UnfoldedCandidate& candidate, int rounds) {
  TORCH_CHECK(candidate.key.size() == 16, "timeUnfoldedCandidate: a key of ", candidate.key.size(), " values");
  const Geometry g = Geometry::unpack(candidate.key);
  const at::MemoryFormat format =
      candidate.key[14] != 0 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  torch::AutoGradMode gradients(true);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(g.c, g.out, {g.kh, g.kw})
                             .stride({g.sh, g.sw})
                             .padding({g.ph, g.pw})
                             .bias(candidate.key[15] != 0));
  if (g.tapsLast) {
    torch::NoGradGuard noGrad;
    conv->weight.set_data(conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
  }
  const at::Tensor x = torch::randn({g.n, g.c, g.h, g.w}).contiguous(format).requires_grad_(true);
  const at::Tensor gy = torch::randn({g.n, g.out, g.oh, g.ow}).contiguous(format);
  auto pass = [&](bool unfolded) {
    const auto start = std::chrono::steady_clock::now();
    (unfolded ? gemmConv(*conv, x) : conv->forward(x)).backward(gy);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (at::Tensor t : {x, conv->weight, conv->bias}) {
      if (t.defined()) t.mutable_grad() = at::Tensor();
    }
    return seconds;
  };
  pass(false);
  pass(true);
  std::array<double, 2> best{1e300, 1e300};
  for (int r = 0; r < rounds; ++r) {
    best[0] = std::min(best[0], pass(false));
    best[1] = std::min(best[1], pass(true));
  }
  return best;
}

void setUnfoldedChoices(std::map<std::vector<int64_t>, bool> choices) {
  std::lock_guard<std::mutex> lock(choicesMutex);
  unfoldedChoices = std::move(choices);
}

at::Tensor gemmConv(torch::nn::Conv2dImpl& conv, const at::Tensor& x) {
  Geometry g;
  TORCH_CHECK(productsTakeConvolution(conv, x) && geometryOf(conv, x, &g), "gemmConv: a convolution it does not take");
  gemmCalls.fetch_add(1, std::memory_order_relaxed);
  const bool hasBias = conv.bias.defined();
  return GemmConvFunction::apply(x, conv.weight, hasBias ? conv.bias : conv.weight.new_empty({0}), hasBias,
                                 g.pack());
}

int64_t gemmConvCalls() { return gemmCalls.load(std::memory_order_relaxed); }

}  // namespace cohort::models
