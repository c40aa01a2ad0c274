// `cohort export --format safetensors | huggingface` (serve/detail/exporters.h):
// the trained tensors themselves, in cohort's names or in Hugging Face's
// GPT-2 layout, written one tensor at a time.

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>

#include "cohort/ckpt/safetensors.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/models/hf_gpt2.h"
#include "cohort/data/tokenizer.h"
#include "cohort/models/hf_bert.h"
#include "cohort/models/hf_llama.h"
#include "cohort/models/lora.h"
#include "serve/detail/exporters.h"

namespace cohort::serve::detail {
namespace {

namespace fs = std::filesystem;

// Calls `visit` with each of the model's published tensors in order, read
// one at a time when the model is not built, and the tied second names
// with `tied` instead.
void visitTensors(const TrainedModel& m, const std::function<void(const std::string&, const at::Tensor&)>& visit,
                  const std::function<void(const std::string&, const std::string&)>& tied) {
  if (m.weights) {
    std::map<std::string, std::string> aliases;
    for (const auto& [second, name] : models::tiedNamesOf(m.job.model)) aliases.emplace(second, name);
    for (const std::string& name : m.order) {
      if (auto a = aliases.find(name); a != aliases.end()) {
        tied(name, a->second);
        continue;
      }
      visit(name, m.weights->load(name));
      m.weights->drop(name);
    }
    return;
  }
  const ckpt::StateDict dict = models::hasAdapters(*m.model) ? models::mergedStateDict(*m.model)
                                                              : models::publishedStateDict(*m.model);
  std::map<std::string, std::string> aliases;
  for (const auto& [name, of] : m.model->tiedNames()) aliases.emplace(name, of);
  for (const auto& [name, t] : dict) {
    if (auto a = aliases.find(name); a != aliases.end()) {
      tied(name, a->second);
    } else {
      visit(name, t);
    }
  }
}

}  // namespace

void writeSafetensors(const TrainedModel& m, const std::string& path) {
  ckpt::SafetensorsWriter out(path, {{"cohort_arch", m.info.arch}});
  visitTensors(
      m, [&](const std::string& name, const at::Tensor& t) { out.add(name, t); },
      [&](const std::string& name, const std::string& of) { out.alias(name, of); });
  out.finish();
}

namespace {

void createExportDir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw UsageError(fmt::format("--out {}: exists and is not a directory", dir));
  }
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create directory {}: {}", dir, ec.message()));
}

// The training data's tokenizer beside the weights, as Hugging Face's
// model directories carry it: tokenizer.json, or a SentencePiece
// tokenizer.model; nothing for the byte tokenizer.
void writeTokenizer(const TrainedModel& m, const std::string& dir) {
  if (!m.info.text || m.info.text->model().empty()) return;
  const bool json = m.info.text->name() == data::kHuggingFaceTokenizer;
  writeFileAtomic((fs::path(dir) / (json ? data::kTokenizerJsonFile : data::kTokenizerModelFile)).string(),
                  m.info.text->model());
}

// LlamaForCausalLM's layout is cohort's llama's own: the tensors as they
// are, a tied head left out as transformers saves it, and config.json.
void writeHfLlama(const TrainedModel& m, const std::string& dir) {
  createExportDir(dir);
  models::LlamaOptions o = models::llamaOptions(m.job.model, m.info.vocabSize);
  o.vocabSize = m.info.vocabSize;
  ckpt::SafetensorsWriter out((fs::path(dir) / "model.safetensors").string(), {{"format", "pt"}});
  visitTensors(
      m, [&](const std::string& name, const at::Tensor& t) { out.add(name, t); },
      [](const std::string&, const std::string&) {});
  out.finish();
  writeFileAtomic((fs::path(dir) / "config.json").string(), models::hfLlamaConfig(o).dump(2) + "\n");
  writeTokenizer(m, dir);
}

// BertForMaskedLM's and BertForSequenceClassification's layouts are
// cohort's bert's own; the decoder's tied weight and bias are left out, as
// transformers saves them.
void writeHfBert(const TrainedModel& m, const std::string& dir) {
  createExportDir(dir);
  models::BertOptions o = models::bertOptions(m.job.model, m.info.vocabSize, m.job.model.padToken);
  o.vocabSize = m.info.vocabSize;
  if (m.info.text) o.padId = m.info.text->tokenId("[PAD]");
  ckpt::SafetensorsWriter out((fs::path(dir) / "model.safetensors").string(), {{"format", "pt"}});
  visitTensors(
      m, [&](const std::string& name, const at::Tensor& t) { out.add(name, t); },
      [](const std::string&, const std::string&) {});
  out.finish();
  writeFileAtomic((fs::path(dir) / "config.json").string(), models::hfBertConfig(o).dump(2) + "\n");
  writeTokenizer(m, dir);
}

}  // namespace

void writeHuggingFace(const TrainedModel& m, const std::string& dir) {
  const ModelConfig& mc = m.job.model;
  if (mc.arch == ModelArch::llama) {
    writeHfLlama(m, dir);
    return;
  }
  if (mc.arch == ModelArch::bert) {
    writeHfBert(m, dir);
    return;
  }
  if (mc.arch != ModelArch::gpt) {
    throw UsageError(fmt::format("--format huggingface writes GPT-2's, Llama's or BERT's layout: model.arch gpt, "
                                 "llama or bert, not {}",
                                 choiceName(mc.arch)));
  }
  if (!mc.bias) {
    throw UsageError("--format huggingface: GPT-2 has biases in every layer; a model with model.bias false has no "
                     "Hugging Face GPT-2 layout (export it as safetensors)");
  }
  createExportDir(dir);
  models::GptOptions o = models::gptOptions(mc, m.info.vocabSize);
  o.vocabSize = m.info.vocabSize;
  ckpt::SafetensorsWriter out((fs::path(dir) / "model.safetensors").string());
  // Each block's causal mask follows its last tensor, as transformers'
  // GPT2Attention registers it: [1, 1, n_positions, n_positions], 1 on and
  // below the diagonal.
  const at::Tensor mask = torch::ones({o.blockSize, o.blockSize}, torch::kBool).tril().view({1, 1, o.blockSize, o.blockSize});
  visitTensors(
      m,
      [&](const std::string& name, const at::Tensor& t) {
        out.add(name, models::hfTransposed(name) ? t.t().contiguous() : t);
        const std::string ln1 = ".ln_1.bias";  // the block's mask follows its first LayerNorm
        if (name.size() > ln1.size() && name.compare(name.size() - ln1.size(), ln1.size(), ln1) == 0) {
          out.add(name.substr(0, name.size() - ln1.size()) + ".attn.bias", mask);
        }
      },
      [&](const std::string& name, const std::string& of) { out.alias(name, of); });
  out.finish();
  writeFileAtomic((fs::path(dir) / "config.json").string(), models::hfGpt2Config(o, mc.activation).dump(2) + "\n");
  writeTokenizer(m, dir);
}

}  // namespace cohort::serve::detail
