// The fused ops on bfloat16 (src/models/fused_ops.h) against float64 on the
// same values, forward and backward, on shapes and values the input picks.
//
// Input: byte 0 the op (even: the causal softmax, odd: GELU, exact or tanh
// by its second bit), byte 1 a size (from 1, 2, 3, 5, 15, 16, 17, 31, 32,
// 33, 64, 65, 257), byte 2 the matrices or rows (1-4) and flags
// (non-contiguous input; for the softmax what lies past each query's
// position: -inf, a large value or NaN, and whether the queries are the
// last half of the positions rather than all), the rest the values in [-4, 4) by 1/32
// times 4, repeated to fill. A value or gradient off the reference by more
// than the bounds tests/models/bf16_ops_test.cc states, a softmax value
// past its query's position not 0, or any exception is a finding.

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_tensor.h"
#include "fuzz_util.h"
#include "models/fused_ops.h"

namespace {

constexpr int64_t kSizes[] = {1, 2, 3, 5, 15, 16, 17, 31, 32, 33, 64, 65, 257};

// One bfloat16 rounding, and the gradients' bound
// (tests/models/bf16_ops_test.cc).
constexpr double kBf16Rel = 1.0 / 256;
constexpr double kGradRel = 2.0 / 256 + 1.0 / 4096;

// The values as every other one of a wider tensor's first dimension
// (strided), or as they are; a leaf.
at::Tensor asInput(const at::Tensor& values, bool strided) {
  if (!strided) return values.detach().clone().requires_grad_(true);
  std::vector<int64_t> wide = values.sizes().vec();
  wide[0] *= 2;
  at::Tensor view = torch::zeros(wide, values.options()).slice(0, 0, wide[0], 2);
  view.copy_(values);
  return view.detach().requires_grad_(true);
}

void within(const at::Tensor& got, const at::Tensor& want, const at::Tensor& tol, const std::string& what) {
  const at::Tensor excess = (got.to(torch::kDouble) - want).abs() - tol;
  if (excess.numel() > 0 && !(excess.max().item<double>() <= 0)) {
    cohort::fuzz::finding(what + " off by " + std::to_string((got.to(torch::kDouble) - want).abs().max().item<double>()));
  }
}


// Softmax of [matrices, q, t] scores, the queries the last q of t.
void causalSoftmax(const uint8_t* data, size_t size, int64_t q, int64_t t, int64_t matrices, bool strided,
                   int above) {
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor mask = torch::ones({q, t}, torch::kBool).triu(t - q + 1);
  // Scores as bfloat16, their float64 values the reference's.
  const at::Tensor values = (cohort::fuzz::inputValues(data, size, 3, {matrices, q, t}) * 4).to(at::kBFloat16);
  const at::Tensor fill = torch::full({}, above == 0 ? -inf : above == 1 ? 1e30 : std::nan(""), torch::kDouble);
  const at::Tensor scores = asInput(values.masked_fill(mask, fill.to(at::kBFloat16)), strided);
  const at::Tensor gy = cohort::fuzz::inputValues(data, size, 4, {matrices, q, t}).to(at::kBFloat16);

  const at::Tensor ref = values.to(torch::kDouble).masked_fill(mask, -inf).requires_grad_(true);
  const at::Tensor want = torch::softmax(ref, -1);
  const at::Tensor g = gy.to(torch::kDouble).masked_fill(mask, 0);
  want.backward(g);

  const at::Tensor y = cohort::models::detail::causalSoftmaxFused(scores);
  within(y, want.detach(), want.detach().abs() * kBf16Rel, "softmax");
  if (y.masked_select(mask.expand(y.sizes())).abs().sum().item<double>() != 0) {
    cohort::fuzz::finding("a value past its query's position is not 0");
  }
  y.backward(gy);
  const at::Tensor w = want.detach();
  const at::Tensor rowScale = (w * g).abs().sum(-1, true) + g.abs();
  within(scores.grad(), ref.grad(), kGradRel * (ref.grad().abs() + w * rowScale), "softmax gradient");
}

// GELU of [rows, n] values.
void gelu(const uint8_t* data, size_t size, int64_t n, int64_t rows, bool strided, bool tanh) {
  const at::Tensor values = (cohort::fuzz::inputValues(data, size, 3, {rows, n}) * 4).to(at::kBFloat16);
  const at::Tensor h = asInput(values, strided);
  const at::Tensor gy = cohort::fuzz::inputValues(data, size, 4, {rows, n}).to(at::kBFloat16);
  const at::Tensor ref = values.to(torch::kDouble).requires_grad_(true);
  const at::Tensor want = torch::gelu(ref, tanh ? "tanh" : "none");
  want.backward(gy.to(torch::kDouble));
  const at::Tensor y = cohort::models::detail::geluBf16Fused(h, tanh);
  const at::Tensor a = 1 + ref.detach().abs();
  within(y, want.detach(), kBf16Rel * want.detach().abs() + 2e-7 * a, "gelu");
  y.backward(gy);
  within(h.grad(), ref.grad(), kGradRel * ref.grad().abs() + 4e-7 * gy.to(torch::kDouble).abs() * a, "gelu gradient");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  static const bool once = [] {
    at::set_num_threads(1);
    return true;
  }();
  (void)once;
  const int64_t n = kSizes[data[1] % 13];
  const int64_t count = 1 + data[2] % 4;
  const bool strided = (data[2] >> 2) & 1;
  if (data[0] % 2 == 0) {
    // Bit 5: the queries the last half of the positions (a block of them).
    const int64_t q = (data[2] >> 5) & 1 ? (n + 1) / 2 : n;
    causalSoftmax(data, size, q, n, count, strided, (data[2] >> 3) % 3);
  } else {
    gelu(data, size, n, count, strided, (data[0] >> 1) & 1);
  }
  return 0;
}
