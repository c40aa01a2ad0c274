#pragma once

// `cohort export MODEL --format onnx|torchscript`: a trained model as a file
// another runtime loads (ONNX Runtime, PyTorch, LibTorch), with the input
// normalization folded into the graph and ModelInfo (serve/model.h) in its
// metadata, so a client sends raw pixels or token ids. `--format
// safetensors` writes the trained tensors alone; `--format huggingface` a
// gpt in Hugging Face's GPT-2 layout (a directory).

#include <cstdint>
#include <ostream>
#include <string>

namespace cohort::serve {

struct ExportOptions {
  std::string model;       // MODEL (serve/model.h)
  std::string job;         // --job: the job file for a weights file outside a run directory
  std::string format;      // "onnx" | "torchscript" | "safetensors" | "huggingface"
  std::string out;         // --out; "": <run dir>/model/model.onnx | model.ts.pt | model.safetensors | hf/ (or beside MODEL)
  int64_t batch = 0;       // --batch: 0 = dynamic (the default), N = fixed batch of N
  int64_t opset = 17;      // ONNX opset
};

// Writes the export and prints what it wrote (path, format, opset, inputs and
// outputs with their shapes). Returns 0; throws UsageError for a bad option
// or a model the format cannot hold, DataError/IoError naming the file.
int exportCommand(const ExportOptions& options, std::ostream& out);

}  // namespace cohort::serve
