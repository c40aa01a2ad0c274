// The fused SGD step (src/train/optimizer.cc, its loop
// src/train/detail/fused_sgd_loop.h) against LibTorch's torch::optim::SGD:
// a numeric kernel whose vector loop and partial last vector take any size.
//
// Input: a header of hyperparameters (lr, momentum, dampening, Nesterov,
// weight decay, steps) and tensor sizes (1, primes, up to ~4100), then the
// bytes the parameters' and gradients' values are made of (moderate finite
// floats of both signs, exact zeros among them). Each float32 parameter
// must agree with the reference within 1e-5 of the magnitudes its steps
// went through (its largest |p| and the sum of the update terms'
// magnitudes, computed in double); a float64 parameter, which takes
// LibTorch's operations, must agree bitwise; so must the momentum buffers'
// presence.

#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cohort/train/optimizer.h"
#include "fuzz_tensor.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  if (size < 8) return 0;
  fuzz::ByteStream in(data, size);
  const uint8_t flags = in.next();
  const bool withDouble = (flags & 1) != 0;
  const int tensors = 1 + (flags >> 1) % 8;
  const int steps = 1 + in.next() % 5;
  const double lrs[] = {1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0};
  const double momenta[] = {0.0, 0.5, 0.9, 0.99};
  const double dampenings[] = {0.0, 0.1, 0.5};
  const double decays[] = {0.0, 1e-4, 1e-2, 0.1};
  const uint8_t h = in.next(), k = in.next();
  const double momentum = momenta[(h / 6) % 4];
  // LibTorch's SGD refuses Nesterov without momentum or with dampening.
  const bool nesterov = momentum != 0 && (k & 1) != 0;
  torch::optim::SGDOptions o(lrs[h % 6]);
  o.momentum(momentum).nesterov(nesterov).weight_decay(decays[(k / 2) % 4]);
  o.dampening(nesterov ? 0.0 : dampenings[(k / 8) % 3]);

  fuzz::OptimizerCase drawn = fuzz::drawOptimizerCase(in, tensors, withDouble, steps);
  const std::vector<at::Tensor>& fused = drawn.fused;
  const std::vector<at::Tensor>& reference = drawn.reference;
  const std::vector<at::Tensor>& initial = drawn.initial;
  const auto& grads = drawn.grads;
  OptimizerConfig c;
  c.name = OptimizerKind::sgd;
  c.lr = o.lr();
  c.momentum = o.momentum();
  c.nesterov = o.nesterov();
  c.weightDecay = o.weight_decay();
  auto ours = train::createOptimizer(c, fused);
  for (auto& group : ours->param_groups()) {
    static_cast<torch::optim::SGDOptions&>(group.options()).dampening(o.dampening());
  }
  torch::optim::SGD theirs(reference, o);
  fuzz::stepBoth(drawn, *ours, theirs);

  const double lr = o.lr(), wd = o.weight_decay(), keep = 1 - o.dampening();
  for (size_t t = 0; t < fused.size(); ++t) {
    if (fused[t].scalar_type() != at::kFloat) {
      fuzz::require(torch::equal(fused[t], reference[t]), "a float64 parameter differs from SGD's");
      continue;
    }
    const float* a = fused[t].data_ptr<float>();
    const float* b = reference[t].data_ptr<float>();
    const float* p0 = initial[t].data_ptr<float>();
    for (int64_t i = 0; i < fused[t].numel(); ++i) {
      // The steps in double, with the magnitudes of their terms.
      double p = p0[i], buf = 0, bufMagnitude = 0, largest = std::fabs(p), terms = 0;
      for (int s = 0; s < steps; ++s) {
        const double g = grads[s][t].data_ptr<float>()[i];
        const double d = g + wd * p;
        const double dMagnitude = std::fabs(g) + wd * std::fabs(p);
        double step = d, stepMagnitude = dMagnitude;
        if (momentum != 0) {
          buf = s == 0 ? d : momentum * buf + keep * d;
          bufMagnitude = s == 0 ? dMagnitude : momentum * bufMagnitude + keep * dMagnitude;
          step = nesterov ? d + momentum * buf : buf;
          stepMagnitude = nesterov ? dMagnitude + momentum * bufMagnitude : bufMagnitude;
        }
        p -= lr * step;
        terms += lr * stepMagnitude;
        largest = std::max(largest, std::fabs(p));
      }
      fuzz::requireElement(t, fused[t].numel(), i, a[i], b[i], largest, terms, "SGD");
    }
  }
  return 0;
}
