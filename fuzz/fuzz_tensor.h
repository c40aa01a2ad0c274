#pragma once

// What the fuzz targets of tensor code share (those that link LibTorch).

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <vector>

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

}  // namespace cohort::fuzz
