// The blockwise causal attention kernel (src/models/flash_attention.cc):
// its output and its gradients of q, k and v against the product of the
// whole score matrix in ATen, in float64, on shapes and values the input
// chooses.
//
// Input: 4 bytes of shape (B 1..3, H 1..3, T 1..140 so that it crosses the
// block size of 64 twice, D 1..40), then the values of q, k, v and the
// output's weights in the loss, one byte each mapped onto [-4, 4) (bytes
// past the end read as 0, so every input is a case). A difference beyond
// 1e-9 (relative and absolute) is a finding.

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
  return 0;
}
