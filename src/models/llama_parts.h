#pragma once

// What the Llama decoder (llama.cc) and its tensor-parallel slices
// (parallel/tensor_llama.cc) compute alike: RMSNorm, the rotary
// embedding's tables and rotation, grouped-query heads widened.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "cohort/models/llama.h"

namespace cohort::models {

// x / rms(x) * weight, the mean of squares taken in float32 whatever x's
// dtype, the result cast back before the weight multiplies it (as Hugging
// Face's LlamaRMSNorm). The weight starts at ones.
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t n, double eps) : eps_(eps) { weight_ = register_parameter("weight", torch::ones({n})); }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor f = x.to(torch::kFloat);
    return weight_ * (f * torch::rsqrt(f.pow(2).mean(-1, /*keepdim=*/true) + eps_)).to(x.scalar_type());
  }

 private:
  double eps_;
  at::Tensor weight_;
};
TORCH_MODULE(RmsNorm);

// The rotary embedding's cos and sin [block_size, head_dim] (float32) of
// positions 0 .. block_size - 1.
inline std::pair<at::Tensor, at::Tensor> rotaryTables(const LlamaOptions& o) {
  const at::Tensor inverse = ropeInverseFrequencies(o.nEmbd / o.nHead, o.rope);
  const at::Tensor angles = torch::outer(torch::arange(o.blockSize, torch::kFloat), inverse);
  const at::Tensor both = torch::cat({angles, angles}, -1);
  return {both.cos(), both.sin()};
}

// x [..., D] rotated by the angles whose cos and sin are given (broadcast
// against x, [.., D]): the first half of each head's dimensions paired with
// the second (Hugging Face's rotate_half).
inline at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor turned = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + turned * sin.to(x.scalar_type());
}

// m [B, KV, T, D] as [B, H, T, D]: key/value head j read by query heads
// j H/KV .. (j + 1) H/KV - 1.
inline at::Tensor widenHeads(const at::Tensor& m, int64_t heads) {
  const int64_t b = m.size(0), kv = m.size(1), t = m.size(2), d = m.size(3);
  if (kv == heads) return m;
  return m.unsqueeze(2).expand({b, kv, heads / kv, t, d}).reshape({b, heads, t, d});
}

}  // namespace cohort::models
