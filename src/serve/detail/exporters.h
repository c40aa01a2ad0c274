#pragma once

// The two writers behind `cohort export` (serve/export.h): each takes the
// trained model and writes one file at `path` (atomically, parent
// directories created). Both fold the input normalization in and record
// ModelInfo; both throw UsageError for a model the format cannot hold and
// IoError naming the path when it cannot be written.

#include <cstdint>
#include <string>

#include "cohort/serve/model.h"

namespace cohort::serve::detail {

// ONNX (opset 17, the default domain only): input "pixels" float32 [batch,
// C, H, W] or "tokens" int64 [batch, time], output "logits". `batch` 0
// leaves the batch axis free (dim_param "batch"), N fixes it.
void writeOnnx(const TrainedModel& m, int64_t batch, int64_t opset, const std::string& path);

// TorchScript: a torch::jit::Module whose state dict is the model's (LoRA
// merged) and whose forward takes what the Predictor takes (model.h), with
// ModelInfo in the extra file kInfoExtraFile.
void writeTorchScript(const TrainedModel& m, const std::string& path);

// The trained tensors as one safetensors file in cohort's names (LoRA
// merged; the tied head a name in the metadata only).
void writeSafetensors(const TrainedModel& m, const std::string& path);

// A gpt in Hugging Face's GPT-2 layout (models/hf_gpt2.h): `dir`/config.json
// and `dir`/model.safetensors, the Conv1D weights transposed and each
// block's attn.bias mask added, as transformers' GPT2LMHeadModel saves it.
// UsageError for another architecture or a model without biases.
void writeHuggingFace(const TrainedModel& m, const std::string& dir);

}  // namespace cohort::serve::detail
