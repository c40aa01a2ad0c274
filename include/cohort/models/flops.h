#pragma once

// Model FLOPs: the floating-point operations a model's matrix products and
// convolutions do for one sample, counted from its shapes (not measured),
// for model FLOPs utilization (MFU): achieved model FLOP/s against what the
// machine's matrix product reaches (health/ceiling.h).
//
// The count is the convention of MFU figures (PaLM's appendix B, nanoGPT):
//  - a multiply-add is 2 FLOPs; elementwise work (norms, activations,
//    softmax, the optimizer) is not counted;
//  - attention counts q k^T and the weighted sum over the whole context, 4 T C
//    per token and layer, causal or not;
//  - training is 3x the forward (the backward computes the gradients of the
//    inputs and of the weights, each as much as the forward); recomputed
//    forwards are not counted (they are the hardware's work, not the model's);
//    with model.lora the frozen base has no weight gradients: 2x.
// For a GPT of L layers, width C, context T and vocabulary V that is
// 6 (12 L C^2 + C V) + 12 L T C per token: 6N + 12 L C T with N the
// parameters of the blocks and the head.
//
// This header does not include LibTorch.

#include <cstdint>
#include <string>

#include "cohort/config/job.h"

namespace cohort::models {

struct ModelFlops {
  bool known = false;
  std::string why;                // known == false: why it is not counted
  double forwardPerSample = 0;    // FLOPs of one sample's forward (a token window, an image)
  double trainingPerSample = 0;   // 3 x forwardPerSample (2 x with model.lora)
  std::string formula;            // how it was counted, e.g. "gpt: 2 (12 L C^2 + C V) + 4 L T C per token"
};

// `config` resolved against the data (vocab_size, in_channels set);
// `height` x `width` an image's size (image models; ignored for token
// models, whose sample is a window of model.block_size tokens). The whole model's count,
// whatever part of it this rank holds. TorchScript models are not counted
// (their shapes are not known from the job).
ModelFlops countModelFlops(const ModelConfig& config, int64_t height = 0, int64_t width = 0);

}  // namespace cohort::models
