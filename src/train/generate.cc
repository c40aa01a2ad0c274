#include "cohort/train/generate.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/resume.h"
#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "cohort/core/run_dir.h"
#include "cohort/data/shard_source.h"
#include "cohort/data/tokens.h"
#include "cohort/models/lora.h"
#include "cohort/models/model.h"
#include "cohort/storage/storage.h"

namespace cohort::train {

namespace fs = std::filesystem;

std::string loadLoraBase(models::Model& model, const JobConfig& job, const RunDir& runDir) {
  ModelConfig mc = job.model;
  std::error_code ec;
  if (mc.initFrom.empty()) {
    if (!fs::is_regular_file(runDir.frozenBase(), ec)) {
      throw DataError(fmt::format(
          "{}: model.lora without model.init_from, and no {}: the random frozen weights the "
          "adapters were trained beside were not kept (a run from before cohort wrote them). Set "
          "model.init_from, or train with output.merge_lora",
          runDir.root, runDir.frozenBase()));
    }
    mc.initFrom = runDir.frozenBase();
  }
  models::loadFrozenBase(model, mc);
  return mc.initFrom;
}

void checkLoraBase(const models::Model& model, const std::string& recorded, const std::string& where,
                   const std::string& base) {
  if (recorded.empty()) return;
  const std::string loaded = models::frozenDigest(model);
  if (loaded != recorded) {
    throw DataError(fmt::format("{}: its LoRA adapters were trained beside other frozen weights than "
                                "{} holds (digest {} there, {} here)",
                                where, base, recorded, loaded));
  }
}

namespace {

std::string recordedLoraDigest(const RunDir& runDir) {
  std::ifstream in(runDir.summary());
  if (!in) return "";
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  const auto it = j.find("lora_base_digest");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

std::string loadTrainedWeights(models::Model& model, const JobConfig& job, const RunDir& runDir) {
  std::error_code ec;
  if (fs::is_regular_file(runDir.finalModel(), ec)) {
    ckpt::LazyStateDict file(runDir.finalModel());  // one tensor at a time
    models::loadWeights(model, file, runDir.finalModel());
    return runDir.finalModel();
  }
  std::string base;
  const bool lora = job.model.lora.rank > 0;
  if (lora) {
    base = loadLoraBase(model, job, runDir);
    if (fs::is_regular_file(runDir.adapters(), ec)) {
      ckpt::loadStateDict(models::adapterStateDict(model), ckpt::readStateDict(runDir.adapters()),
                          runDir.adapters());
      checkLoraBase(model, recordedLoraDigest(runDir), runDir.adapters(), base);
      return base + " + " + runDir.adapters();
    }
  }
  if (auto point = ckpt::newestValidCheckpoint(ckpt::checkpointDir(job, runDir))) {
    const std::string file = point->path + "/model.bin";
    const ckpt::Manifest manifest = ckpt::readManifest(point->path);
    ckpt::CheckpointTensors checkpoint(point->path, manifest);  // one tensor at a time
    ckpt::loadStateDict(models::trainedState(model), checkpoint, checkpoint.entries(), file);
    if (!lora) return file;
    checkLoraBase(model, manifest.extra.value("lora_base_digest", ""), point->path, base);
    return base + " + " + file;
  }
  throw DataError(fmt::format("{}: no trained weights (neither model/final.pt, model/adapters.pt nor a "
                              "valid checkpoint)",
                              runDir.root));
}

int64_t sampleNext(const at::Tensor& logits, double temperature, int64_t topK, at::Generator& gen) {
  if (temperature < kGreedyTemperature) return logits.argmax().item<int64_t>();
  at::Tensor scaled = logits / temperature;
  if (topK > 0 && topK < scaled.size(0)) {
    const at::Tensor kth = std::get<0>(scaled.topk(topK)).index({topK - 1});
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<float>::infinity());
  }
  return torch::multinomial(torch::softmax(scaled, 0), 1, false, gen).item<int64_t>();
}

std::vector<int64_t> contextWindow(const std::vector<int64_t>& tokens, int64_t blockSize) {
  const size_t block = static_cast<size_t>(blockSize);
  const size_t start = tokens.size() > block ? tokens.size() - block : 0;
  return {tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end()};
}

int generateCommand(const GenerateOptions& o, std::ostream& out) {
  if (o.tokens < 0) throw UsageError(fmt::format("--tokens: must be >= 0, got {}", o.tokens));
  if (!(o.temperature >= 0)) {
    throw UsageError(fmt::format("--temperature: must be >= 0, got {}", o.temperature));
  }
  if (o.topK < 0) throw UsageError(fmt::format("--top-k: must be >= 0, got {}", o.topK));
  const RunDir runDir{o.runDir};
  std::error_code ec;
  if (!fs::is_regular_file(runDir.jobFile(), ec)) {
    throw UsageError(fmt::format("{}: not a run directory (no job.yaml)", o.runDir));
  }
  const JobConfig job = loadJob(runDir.jobFile());
  if (!tokenModel(job)) {
    throw UsageError(fmt::format("{}: model.arch is {} on {} data; generate needs a language model "
                                 "(gpt, or torchscript on tokens)",
                                 runDir.jobFile(), choiceName(job.model.arch),
                                 choiceName(job.data.train.kind)));
  }
  // The tokenizer is the training data's.
  CacheConfig noCache;
  noCache.enabled = false;
  const data::ShardSource source(job.data.train.path, storage::storageOptions(job.storage), noCache);
  const data::DatasetManifest& m = source.manifest();

  torch::NoGradGuard noGrad;
  ModelConfig mc = job.model;
  if (mc.vocabSize == 0) mc.vocabSize = m.vocabSize;
  auto model = models::createModel(mc, {});
  const std::string weights = loadTrainedWeights(*model, job, runDir);
  model->eval();
  std::cerr << "cohort generate: weights from " << weights << "\n";

  const std::string prompt = o.prompt.empty() ? std::string("\n") : o.prompt;
  std::vector<int64_t> tokens = data::encodeText(m.tokenizer, prompt);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  for (int64_t i = 0; i < o.tokens; ++i) {
    const at::Tensor input = torch::tensor(contextWindow(tokens, job.model.blockSize), torch::kInt64).unsqueeze(0);
    // Only ids the tokenizer can decode (model.vocab_size may be larger).
    const at::Tensor logits = model->forward(input)
                                  .select(1, input.size(1) - 1)
                                  .squeeze(0)
                                  .narrow(0, 0, std::min<int64_t>(m.vocabSize, mc.vocabSize))
                                  .to(torch::kFloat);
    tokens.push_back(sampleNext(logits, o.temperature, o.topK, generator));
  }
  out << data::decodeTokens(m.tokenizer, tokens) << "\n";
  return 0;
}

}  // namespace cohort::train
