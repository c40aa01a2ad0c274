// The blockwise causal attention kernel (src/models/flash_attention.cc):
// its output and its gradients of q, k and v against the product of the
// whole score matrix in ATen, in float64, on shapes and values the input
// chooses.
//
// Input: 4 bytes of shape (B 1..3, H 1..3, T 1..140 so that it crosses the
// block size of 64 twice, D 1..40), then the values of q, k, v and the
// output's weights in the loss, one byte each mapped onto [-4, 4) (bytes
// past the end read as 0, so every input is a case). A difference beyond
// 1e-9 (relative and absolute) is a finding. The same values in float32
// (exact there: multiples of 1/32), which take the tile kernels of the
// widest build (models/fused_kernels.h): a finding when the kernel's
// distance from float64's result is more than 4 times the whole matrix's
// own in float32, plus (1e-5 + 2.4e-7 x the largest score) x (1 + the
// result's largest magnitude): backward recomputes the probabilities as
// exp(score - logsumexp), and a float logsumexp near 100 is off by up to
// 4e-6 of itself, where the whole matrix's softmax divides by its sum.

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "models/flash_attention.h"

namespace {

at::Tensor wholeMatrixAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  const at::Tensor future = torch::ones({t, t}, torch::kBool).triu(1);
  const at::Tensor p = torch::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  return torch::matmul(p, v).transpose(1, 2).contiguous().view({b, t, h * d});
}

void requireClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  cohort::fuzz::require(got.sizes() == want.sizes() && got.allclose(want, 1e-9, 1e-9),
                        what + " differs from the whole matrix's by " +
                            std::to_string((got - want).abs().max().item<double>()));
}

double distance(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == 0 ? 0.0 : (a.to(at::kDouble) - b).abs().max().item<double>();
}

// Float32's output and gradients against float64's (`want`, `wantGrads`).
void checkFloat(const std::vector<at::Tensor>& qkv64, const at::Tensor& weight64, const at::Tensor& want,
                const std::vector<at::Tensor>& wantGrads) {
  auto floats = [&] {
    std::vector<at::Tensor> out;
    for (const at::Tensor& x : qkv64) out.push_back(x.detach().to(at::kFloat).set_requires_grad(true));
    return out;
  };
  const at::Tensor weight = weight64.to(at::kFloat);
  const std::vector<at::Tensor> mine = floats(), theirs = floats();
  const at::Tensor got = cohort::models::flashAttention(mine[0], mine[1], mine[2]);
  const at::Tensor whole = wholeMatrixAttention(theirs[0], theirs[1], theirs[2]);
  const std::vector<at::Tensor> gotGrads = torch::autograd::grad({(got * weight).sum()}, mine);
  const std::vector<at::Tensor> wholeGrads = torch::autograd::grad({(whole * weight).sum()}, theirs);
  const double largestScore =
      torch::matmul(qkv64[0], qkv64[1].transpose(-2, -1)).abs().max().item<double>() / std::sqrt(double(qkv64[0].size(3)));
  const double relative = 1e-5 + 2.4e-7 * largestScore;
  auto require = [relative](const at::Tensor& g, const at::Tensor& w, const at::Tensor& want, const std::string& what) {
    const double mine = distance(g, want), aten = distance(w, want);
    const double size = want.numel() == 0 ? 0.0 : want.abs().max().item<double>();
    cohort::fuzz::require(mine <= 4 * aten + relative * (1 + size),
                          "float32: " + what + " is " + std::to_string(mine) + " from float64's, the whole matrix " +
                              std::to_string(aten));
  };
  require(got, whole, want, "the output");
  for (size_t i = 0; i < 3; ++i) {
    require(gotGrads[i], wholeGrads[i], wantGrads[i], std::string("the gradient of ") + "qkv"[i]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int64_t b = 1 + data[0] % 3, h = 1 + data[1] % 3, t = 1 + data[2] % 140, d = 1 + data[3] % 40;
  const int64_t n = b * h * t * d;
  std::vector<double> values(static_cast<size_t>(4 * n), 0.0);
  for (size_t i = 0; i < values.size() && 4 + i < size; ++i) values[i] = (data[4 + i] - 128) / 32.0;
  const at::Tensor all = torch::tensor(values, torch::kDouble);
  std::vector<at::Tensor> qkv;
  for (int64_t i = 0; i < 3; ++i) {
    qkv.push_back(all.slice(0, i * n, (i + 1) * n).view({b, h, t, d}).clone().set_requires_grad(true));
  }
  const at::Tensor weight = all.slice(0, 3 * n, 4 * n).view({b, t, h * d});
  const at::Tensor got = cohort::models::flashAttention(qkv[0], qkv[1], qkv[2]);
  const at::Tensor want = wholeMatrixAttention(qkv[0], qkv[1], qkv[2]);
  requireClose(got, want, "the output");
  const std::vector<at::Tensor> gotGrads = torch::autograd::grad({(got * weight).sum()}, qkv);
  const std::vector<at::Tensor> wantGrads = torch::autograd::grad({(want * weight).sum()}, qkv);
  for (size_t i = 0; i < 3; ++i) requireClose(gotGrads[i], wantGrads[i], std::string("the gradient of ") + "qkv"[i]);
  checkFloat(qkv, weight, want.detach(), wantGrads);
  return 0;
}
