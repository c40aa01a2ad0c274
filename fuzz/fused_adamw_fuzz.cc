// The fused AdamW step (src/train/fused_adamw.cc) against LibTorch's
// torch::optim::AdamW: not a parser, a numeric kernel whose vector loop,
// partial last vectors and walk over many tensors take any size.
//
// Input: a header of hyperparameters (lr, betas, eps, weight decay,
// amsgrad, steps) and tensor sizes (1, primes, up to ~4100), then the bytes
// the parameters' and gradients' values are made of (moderate finite floats
// of both signs, exact zeros among them). Each float32 parameter must agree
// with the reference within 1e-5 of the magnitudes its steps went through
// (its largest |p| and the sum of the update terms' magnitudes, computed in
// double: float rounding of the same operations cannot exceed that); a
// float64 parameter, which takes LibTorch's operations, must agree bitwise.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_tensor.h"
#include "fuzz_util.h"
#include "train/detail/fused_adamw.h"


extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  if (size < 8) return 0;
  fuzz::ByteStream in(data, size);
  const uint8_t flags = in.next();
  const bool amsgrad = (flags & 1) != 0;
  const bool withDouble = (flags & 2) != 0;
  const int tensors = 1 + (flags >> 2) % 8;
  const int steps = 1 + in.next() % 5;
  const double lrs[] = {1e-4, 1e-3, 3e-3, 1e-2, 0.1, 1.0};
  const double beta1s[] = {0.0, 0.5, 0.9, 0.99};
  const double beta2s[] = {0.9, 0.99, 0.999, 0.9999};
  const double epss[] = {1e-8, 1e-6, 1e-3, 0.1};
  const double decays[] = {0.0, 1e-2, 0.1, 0.5};
  const uint8_t h = in.next(), k = in.next();
  torch::optim::AdamWOptions o(lrs[h % 6]);
  o.betas({beta1s[(h / 6) % 4], beta2s[(h / 24) % 4]}).eps(epss[k % 4]).weight_decay(decays[(k / 4) % 4]);
  o.amsgrad(amsgrad);

  fuzz::OptimizerCase drawn = fuzz::drawOptimizerCase(in, tensors, withDouble, steps);
  const std::vector<at::Tensor>& fused = drawn.fused;
  const std::vector<at::Tensor>& reference = drawn.reference;
  const std::vector<at::Tensor>& initial = drawn.initial;
  const auto& grads = drawn.grads;
  train::detail::FusedAdamW ours(fused, o);
  torch::optim::AdamW theirs(reference, o);
  fuzz::stepBoth(drawn, ours, theirs);

  const double lr = o.lr(), wd = o.weight_decay(), eps = o.eps();
  const double b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas());
  for (size_t t = 0; t < fused.size(); ++t) {
    if (fused[t].scalar_type() != at::kFloat) {
      fuzz::require(torch::equal(fused[t], reference[t]), "a float64 parameter differs from AdamW's");
      continue;
    }
    const float* a = fused[t].data_ptr<float>();
    const float* b = reference[t].data_ptr<float>();
    const float* p0 = initial[t].data_ptr<float>();
    for (int64_t i = 0; i < fused[t].numel(); ++i) {
      // The steps in double, with the magnitudes of their terms.
      double p = p0[i], m = 0, v = 0, vmax = 0, largest = std::fabs(p), terms = 0;
      for (int s = 0; s < steps; ++s) {
        const double g = grads[s][t].data_ptr<float>()[i];
        const double c1 = 1 - std::pow(b1, s + 1), c2 = 1 - std::pow(b2, s + 1);
        p *= 1 - lr * wd;
        const double mMagnitude = b1 * std::fabs(m) + (1 - b1) * std::fabs(g);
        m = b1 * m + (1 - b1) * g;
        v = b2 * v + (1 - b2) * g * g;
        vmax = std::max(vmax, v);
        const double d = std::sqrt(amsgrad ? vmax : v) / std::sqrt(c2) + eps;
        p -= lr / c1 * m / d;
        terms += lr / c1 * mMagnitude / d;
        largest = std::max(largest, std::fabs(p));
      }
      fuzz::requireElement(t, fused[t].numel(), i, a[i], b[i], largest, terms, "AdamW");
    }
  }
  return 0;
}
