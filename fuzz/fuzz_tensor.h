#pragma once

// What the fuzz targets of tensor code share (those that link LibTorch).

#include <torch/torch.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_util.h"

namespace cohort::fuzz {

// A float64 tensor of `sizes` filled with the input's bytes from `offset`
// on, each as (byte - 128) / 32 (in [-4, 4) by 1/32), repeated to fill;
// zeros when no byte is left.
inline at::Tensor inputValues(const uint8_t* data, size_t size, size_t offset, const std::vector<int64_t>& sizes) {
  at::Tensor t = torch::zeros(sizes, torch::kDouble);
  const int64_t n = t.numel();
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < n && offset < size; ++i) {
    p[i] = (static_cast<int>(data[offset + static_cast<size_t>(i) % (size - offset)]) - 128) / 32.0;
  }
  return t;
}

// The input as a stream of bytes for the optimizer targets (fused_adamw,
// fused_sgd): once it is used up, a deterministic sequence, so that any
// input describes a whole case.
class ByteStream {
 public:
  ByteStream(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t next() {
    if (pos_ < size_) return data_[pos_++];
    state_ = state_ * 1103515245u + 12345u;
    return static_cast<uint8_t>(state_ >> 16);
  }
  // A float m * 2^e of 7 bits of mantissa, e in [-20, 8], or 0.
  float value() {
    const uint8_t a = next(), b = next();
    if (a == 0) return 0;
    const float mantissa = static_cast<float>(a & 0x7f) / 64.0f - 1.0f;
    return std::ldexp(mantissa == 0 ? 1.0f : mantissa, static_cast<int>(b % 29) - 20);
  }
  // A tensor size: mostly 1, primes and the vector widths around them; one
  // draw in eight anything up to 4100.
  int64_t size() {
    static constexpr int64_t kSizes[] = {1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 31, 33, 127, 1031, 2053, 4099};
    const uint8_t s = next();
    return s < 224 ? kSizes[s % 16] : 1 + (static_cast<int64_t>(s) * 131 + next()) % 4100;
  }
  // t's elements from value(), float32 or float64.
  void fill(at::Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.scalar_type() == at::kFloat) {
        t.data_ptr<float>()[i] = value();
      } else {
        t.data_ptr<double>()[i] = value();
      }
    }
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  uint32_t state_ = 1;
};

// One case of the optimizer targets, drawn from the input in this order:
// `tensors` float32 parameters of drawn sizes and values, with
// `withDouble` a float64 one of 7 values after them, then each step's
// gradient of each. `fused` and `reference` start as copies of `initial`.
struct OptimizerCase {
  std::vector<at::Tensor> fused, reference, initial;
  std::vector<std::vector<at::Tensor>> grads;  // [step][parameter]
};

inline OptimizerCase drawOptimizerCase(ByteStream& in, int tensors, bool withDouble, int steps) {
  torch::NoGradGuard noGrad;
  OptimizerCase c;
  auto add = [&](at::Tensor p) {
    in.fill(p);
    c.initial.push_back(p);
    c.fused.push_back(p.clone());
    c.reference.push_back(p.clone());
  };
  for (int t = 0; t < tensors; ++t) add(torch::empty({in.size()}));
  if (withDouble) add(torch::empty({7}, torch::kFloat64));
  c.grads.resize(static_cast<size_t>(steps));
  for (auto& g : c.grads) {
    for (const auto& p : c.fused) {
      at::Tensor x = torch::empty_like(p);
      in.fill(x);
      g.push_back(x);
    }
  }
  return c;
}

// Steps `ours` (over c.fused) and `theirs` (over c.reference) once per
// step with that step's gradients.
inline void stepBoth(OptimizerCase& c, torch::optim::Optimizer& ours, torch::optim::Optimizer& theirs) {
  torch::NoGradGuard noGrad;
  for (const auto& step : c.grads) {
    for (size_t t = 0; t < c.fused.size(); ++t) {
      c.fused[t].mutable_grad() = step[t].clone();
      c.reference[t].mutable_grad() = step[t].clone();
    }
    ours.step();
    theirs.step();
  }
}

// x with 9 significant digits, for a finding's message.
inline std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

// The fused optimizer's element i of parameter t (`got`) against the
// reference's (`want`), both steps computed from the same values: a finding
// beyond 1e-5 of the largest parameter value and the summed step sizes
// (`largest`, `terms`), naming the element and the `reference` optimizer.
inline void requireElement(size_t t, int64_t numel, int64_t i, float got, float want, double largest, double terms,
                           const std::string& reference) {
  const double tolerance = 1e-5 * (largest + terms) + 1e-30;
  if (!(std::fabs(static_cast<double>(got) - want) <= tolerance)) {
    finding("parameter " + std::to_string(t) + " (" + std::to_string(numel) + " elements) element " +
            std::to_string(i) + ": fused " + number(got) + ", " + reference + " " + number(want) + ", tolerance " +
            number(tolerance));
  }
}

}  // namespace cohort::fuzz
