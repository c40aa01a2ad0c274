#include "cohort/serve/export.h"

#include <fmt/format.h>

#include <filesystem>

#include "cohort/core/error.h"
#include "cohort/serve/model.h"
#include "serve/detail/exporters.h"

namespace cohort::serve {

namespace {

// Only opset 17 is written: the version the graphs are checked against
// (LayerNormalization is new in 17, Gelu arrives in 20).
constexpr int64_t kOnnxOpset = 17;

void validateExport(const ExportOptions& o) {
  if (o.format != "onnx" && o.format != "torchscript" && o.format != "safetensors" && o.format != "huggingface") {
    throw UsageError(fmt::format("--format {}: expected onnx, torchscript, safetensors or huggingface",
                                 o.format.empty() ? "''" : o.format));
  }
  if (o.batch < 0) throw UsageError(fmt::format("--batch {}: expected `dynamic` or a size >= 1", o.batch));
  if (o.format == "onnx" && o.opset != kOnnxOpset) {
    throw UsageError(fmt::format("--opset {}: cohort writes opset {} only", o.opset, kOnnxOpset));
  }
  if (o.format != "onnx" && o.batch > 0) {
    throw UsageError(fmt::format("--batch {}: a {} export takes any batch size; --batch applies to --format onnx",
                                 o.batch, o.format));
  }
}

// <run dir>/model/model.onnx | model.ts.pt | model.safetensors | hf/, or
// beside MODEL when it is not in a run directory (weights.pt ->
// weights.onnx).
std::string defaultExportPath(const ExportOptions& o, const TrainedModel& m) {
  const char* ext = o.format == "onnx" ? ".onnx" : o.format == "torchscript" ? ".ts.pt" : o.format == "safetensors" ? ".safetensors" : "-hf";
  if (o.format == "huggingface" && !m.runDir.empty()) return (std::filesystem::path(m.runDir) / "model" / "hf").string();
  if (!m.runDir.empty()) {
    return (std::filesystem::path(m.runDir) / "model" / (std::string("model") + ext)).string();
  }
  std::filesystem::path p(o.model);
  if (!p.has_filename()) p = p.parent_path();  // a directory given as dir/
  return (p.parent_path() / (p.stem().string() + ext)).string();
}

std::string exportShapeText(const ModelInfo& info, bool input, int64_t batch) {
  const std::string b = batch > 0 ? std::to_string(batch) : "batch";
  if (info.tokens) {
    return input ? fmt::format("[{}, time]", b) : fmt::format("[{}, time, {}]", b, info.vocabSize);
  }
  return input ? fmt::format("[{}, {}, {}, {}]", b, info.channels, info.height, info.width)
               : fmt::format("[{}, {}]", b, info.numClasses);
}

}  // namespace

int exportCommand(const ExportOptions& options, std::ostream& out) {
  validateExport(options);
  // Either format needs only the trained tensors' shapes to describe the
  // graph, and their values one at a time as the file is written (TorchScript
  // through a mapped file, script_export.cc): a GPT is not built.
  const TrainedModel m = loadTrainedModel(options.model, options.job, /*weightsOnly=*/true);
  if (options.format == "onnx" && m.job.model.arch == ModelArch::torchscript) {
    throw UsageError(fmt::format(
        "{}: model.arch torchscript (a module of your own): ONNX export covers cohort's built-in "
        "architectures (simple_cnn, resnet18/34/50/101, gpt, llama); export it with --format torchscript",
        options.model));
  }
  const std::string path = options.out.empty() ? defaultExportPath(options, m) : options.out;
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && std::filesystem::equivalent(path, options.model, ec)) {
    throw UsageError(fmt::format("--out {}: is the model being exported; name another path", path));
  }
  if (options.format == "huggingface") {
    detail::writeHuggingFace(m, path);
    out << "wrote " << path << "/config.json and model.safetensors\n"
        << "  format:  huggingface ("
        << (m.job.model.arch == ModelArch::llama  ? "Llama's layout: LlamaForCausalLM"
            : m.job.model.arch == ModelArch::bert ? (m.job.model.task == BertTask::classify
                                                         ? "BERT's layout: BertForSequenceClassification"
                                                         : "BERT's layout: BertForMaskedLM")
                                                  : "GPT-2's layout: GPT2LMHeadModel")
        << ".from_pretrained reads it)\n"
        << "  model:   " << m.info.arch << " from " << m.info.weights << "\n";
    return 0;
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw UsageError(fmt::format("--out {}: is a directory; name the file", path));
  }
  if (options.format == "safetensors") {
    detail::writeSafetensors(m, path);
    out << "wrote " << path << "\n  format:  safetensors (cohort's names; the tied lm_head.weight is "
        << "transformer.wte.weight)\n  model:   " << m.info.arch << " from " << m.info.weights << "\n";
    return 0;
  }
  if (options.format == "onnx") {
    detail::writeOnnx(m, options.batch, options.opset, path);
  } else {
    detail::writeTorchScript(m, path);
  }
  const ModelInfo& info = m.info;
  out << "wrote " << path << "\n"
      << "  format:  " << options.format;
  if (options.format == "onnx") out << " (opset " << options.opset << ", ir_version 8)";
  out << "\n  model:   " << info.arch << " from " << info.weights << "\n"
      << "  input:   " << (info.tokens ? "tokens int64 " : "pixels float32 ")
      << exportShapeText(info, true, options.batch)
      << (info.tokens ? fmt::format(" (time <= {})", info.blockSize)
                      : std::string(" (raw 0..255, normalized inside)"))
      << "\n  output:  logits float32 " << exportShapeText(info, false, options.batch) << "\n"
      << "  metadata: "
      << (options.format == "onnx" ? "metadata_props \"cohort\", \"opset\"" : "extra file cohort.json")
      << " (ModelInfo)\n";
  return 0;
}

}  // namespace cohort::serve
