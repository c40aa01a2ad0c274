#include "cohort/infer/weights.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/resume.h"
#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/weights.h"
#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "cohort/core/run_dir.h"
#include "cohort/data/shard_source.h"
#include "cohort/data/tokens.h"
#include "cohort/models/lora.h"
#include "cohort/models/model.h"
#include "cohort/storage/storage.h"

namespace cohort::infer {

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
  if (const std::string final = runDir.finalWeights(); fs::is_regular_file(final, ec)) {
    const auto file = ckpt::openWeights(final);  // one tensor at a time
    models::loadWeights(model, *file, final);
    return final;
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
    const std::string file = point->path;  // its model files: model.bin, a stage's or a slice's
    const ckpt::Manifest manifest = ckpt::readManifest(point->path);
    ckpt::CheckpointTensors checkpoint(point->path, manifest);  // one tensor at a time
    ckpt::loadStateDict(models::trainedState(model), checkpoint, checkpoint.entries(), file);
    if (!lora) return file;
    checkLoraBase(model, manifest.extra.value("lora_base_digest", ""), point->path, base);
    return base + " + " + file;
  }
  throw DataError(fmt::format("{}: no trained weights (neither model/final.pt, final.safetensors, adapters.pt nor a "
                              "valid checkpoint)",
                              runDir.root));
}

}  // namespace cohort::infer
