#pragma once

// A convolution as one matrix product over its unfolded input, for layers
// whose weight outweighs their output: out channels >= the batch's output
// pixels (ResNet-50's last layer group at 64 px, batch 8: 512 and 2048
// channels on 32 pixels). oneDNN's direct convolution reorders the weight
// into its blocked layout for the forward, again (transposed blocks) for
// the input gradient, and reorders the weight gradient back: three passes
// over the largest tensor of the layer, each costing more than the
// layer's arithmetic at these shapes. Here the input is unfolded into
// [N x Ho x Wo, taps] in the order the weight is stored (channels-last
// weights: kh, kw, C; contiguous: C, kh, kw), so the weight and its
// gradient are read and written in place as [out, taps] matrices by
// oneDNN's sgemm (core/sgemm.h): output = cols W^T, input gradient =
// fold(g W), weight gradient = g^T cols. A 1x1 convolution with stride 1
// on a channels-last input unfolds to the input itself. The output keeps
// the input's memory format; the weight gradient the weight's. Results
// change by float rounding only (tests/models/gemm_conv_test.cc).
//
// Taken for CPU float32 tensors where linear layers take oneDNN
// (cohort/models/linear.h: not under autocast, compute.onednn on, not
// COHORT_GEMM=aten), groups 1, dilation 1, zero padding given as numbers,
// a weight dense as channels-last or contiguous, and out channels >= output
// pixels (N x Ho x Wo); for a kernel of several taps also out channels >
// twice the output pixels or output rows of at most 2 pixels (measured:
// docs/performance.md); otherwise the module's own forward
// (models/window_conv.h's conv2d decides). The unfolded input is kept for the backward: by the
// rule above it is no larger than the weight. The backward is not
// differentiable again (no double backward).

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/conv.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace cohort::models {

// What both convolution products take (this one and the window product of
// models/window_conv.h): x, the weight and any bias CPU float32 tensors
// oneDNN's products take (cohort/models/linear.h), x 4-D, groups 1,
// dilation 1, zero padding given as numbers, not transposed.
bool productsTakeConvolution(const torch::nn::Conv2dImpl& conv, const at::Tensor& x);

// Whether gemmConv() takes x through `conv`.
bool gemmConvTakes(const torch::nn::Conv2dImpl& conv, const at::Tensor& x);

// conv(x) as a matrix product; gemmConvTakes(conv, x) must hold.
at::Tensor gemmConv(torch::nn::Conv2dImpl& conv, const at::Tensor& x);

// Calls that took the product in this process: tests check a model takes it.
int64_t gemmConvCalls();

// Chosen per layer by measurement. A shape the rule takes (input sizes and
// layout, kernel, stride, padding, bias, the weight's layout) is a
// candidate; at start a training rank records the candidates of one
// forward pass, times each both ways and sets what it found
// (train/conv_products.cc): gemmConvTakes then follows that choice for
// those shapes, and the rule for shapes not measured.
struct UnfoldedCandidate {
  std::vector<int64_t> key;
  std::string description;  // "[8,512,2,2] 3x3 s1 -> 512"
};

// The candidates `pass` meets (each once, in order of first use).
std::vector<UnfoldedCandidate> recordUnfoldedCandidates(const std::function<void()>& pass);

// The fastest of `rounds` forward + backward passes of a convolution of
// the candidate's shape, the module's forward and the unfolded product
// alternating after one warm-up each: {module seconds, unfolded seconds}.
std::array<double, 2> timeUnfoldedCandidate(const UnfoldedCandidate& candidate, int rounds);

// Key -> whether to take the unfolded product; replaces earlier choices
// (an empty map: the rule everywhere).
void setUnfoldedChoices(std::map<std::vector<int64_t>, bool> choices);

}  // namespace cohort::models
