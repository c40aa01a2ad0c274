// The fused causal softmax of bfloat16 attention scores
// (src/models/fused_ops.h) against the float64 softmax of the same values,
// forward and backward, on shapes and values the input picks.
//
// Input: byte 0 T (from 1, 2, 3, 5, 15, 16, 17, 31, 32, 33, 64, 65, 257),
// byte 1 the matrices (1-4) and flags (non-contiguous scores, what lies
// above the diagonal: -inf, a large value or NaN), the rest the values in
// [-4, 4) by 1/32 times 4, repeated to fill. A value off the reference by
// more than 2^-8 of it (one bfloat16 rounding), a gradient by more than
// the bound tests/models/causal_softmax_test.cc states, a value above the
// diagonal not 0, or any exception is a finding.

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "fuzz_tensor.h"
#include "fuzz_util.h"
#include "models/fused_ops.h"

namespace {

constexpr int64_t kSizes[] = {1, 2, 3, 5, 15, 16, 17, 31, 32, 33, 64, 65, 257};

void within(const at::Tensor& got, const at::Tensor& want, const at::Tensor& tol, const std::string& what) {
  const at::Tensor excess = (got.to(torch::kDouble) - want).abs() - tol;
  if (excess.numel() > 0 && !(excess.max().item<double>() <= 0)) {
    cohort::fuzz::finding(what + " off by " + std::to_string((got.to(torch::kDouble) - want).abs().max().item<double>()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const bool once = [] {
    at::set_num_threads(1);
    return true;
  }();
  (void)once;
  const int64_t t = kSizes[data[0] % 13];
  const int64_t matrices = 1 + data[1] % 4;
  const bool strided = (data[1] >> 2) & 1;
  const int above = (data[1] >> 3) % 3;
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor mask = torch::ones({t, t}, torch::kBool).triu(1);
  // Scores as bfloat16, their float64 values the reference's.
  const at::Tensor values = (cohort::fuzz::inputValues(data, size, 2, {matrices, t, t}) * 4).to(at::kBFloat16);
  const at::Tensor fill = torch::full({}, above == 0 ? -inf : above == 1 ? 1e30 : std::nan(""), torch::kDouble);
  at::Tensor scores = values.masked_fill(mask, fill.to(at::kBFloat16));
  if (strided) {
    // The same values as every other matrix of a wider batch.
    at::Tensor wide = torch::zeros({2 * matrices, t, t}, at::kBFloat16);
    at::Tensor view = wide.slice(0, 0, 2 * matrices, 2);
    view.copy_(scores);
    scores = view;
  }
  scores = scores.detach().requires_grad_(true);
  const at::Tensor gy = (cohort::fuzz::inputValues(data, size, 3, {matrices, t, t})).to(at::kBFloat16);

  const at::Tensor ref = values.to(torch::kDouble).masked_fill(mask, -inf).requires_grad_(true);
  const at::Tensor want = torch::softmax(ref, -1);
  const at::Tensor g = gy.to(torch::kDouble).masked_fill(mask, 0);
  want.backward(g);

  const at::Tensor y = cohort::models::detail::causalSoftmaxFused(scores);
  within(y, want.detach(), want.detach().abs() / 256, "softmax");
  if (y.masked_select(mask.expand(y.sizes())).abs().sum().item<double>() != 0) {
    cohort::fuzz::finding("a value above the diagonal is not 0");
  }
  y.backward(gy);
  const at::Tensor w = want.detach();
  const at::Tensor rowScale = (w * g).abs().sum(-1, true) + g.abs();
  within(scores.grad(), ref.grad(), (2.0 / 256 + 1.0 / 4096) * (ref.grad().abs() + w * rowScale), "softmax gradient");
  return 0;
}
