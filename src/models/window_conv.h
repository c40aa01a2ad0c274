#pragma once

// A convolution whose output is one pixel per image as one matrix product
// over the input window it sees (ResNet's last layer group on small images:
// 32 px with the ImageNet stem leaves it 1x1 maps). A 3x3 convolution with
// padding 1 on a 1x1 map reads one of its nine taps; oneDNN's convolution
// multiplies all nine, eight of them by padding. Here the taps that fall on
// the input are gathered as [out, in x taps] and multiplied with the
// window's pixels through oneDNN's sgemm (core/sgemm.h), forward and
// backward; the other taps' gradients are zero, as they are. Results change
// by float rounding only (tests/models/window_conv_test.cc).
//
// Taken for CPU float32 tensors where linear layers take oneDNN
// (cohort/models/linear.h: not under autocast, compute.onednn off or
// COHORT_GEMM=aten), groups 1, dilation 1, zero padding given as numbers;
// otherwise, and for outputs larger than one pixel, the module's own
// forward. The backward is not differentiable again (no double backward).
//
// conv2d() takes the window product first, then for larger outputs a
// layer whose weight outweighs its output as one product over the unfolded
// input (models/gemm_conv.h), then the module's forward.

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/conv.h>

#include <cstdint>

namespace cohort::models {

// conv(x), x [N, C, H, W]: the window product, the unfolded product or the
// module's forward, as above.
at::Tensor conv2d(torch::nn::Conv2dImpl& conv, const at::Tensor& x);

// Whether conv2d() takes the window product for x.
bool windowConvTakes(const torch::nn::Conv2dImpl& conv, const at::Tensor& x);

// Calls that took the window product in this process: tests check a model
// takes it.
int64_t windowConvCalls();

}  // namespace cohort::models
