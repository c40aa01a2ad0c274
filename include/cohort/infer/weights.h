#pragma once

// The weights a run trained, loaded into a model built from its job: what
// `cohort generate`, `cohort serve`, `cohort score` and `cohort export`
// start from.

#include <string>

#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/models/model.h"

namespace cohort::infer {

// Loads into `model` (built from `job`) the run's trained weights: those of
// model/final.pt, or a LoRA run's frozen weights (model.init_from, or
// model/base.pt without it) with model/adapters.pt or the newest valid
// checkpoint's adapters, or the newest valid checkpoint. Returns where they
// came from; throws DataError when there are none, or when a LoRA run's
// frozen weights are missing or differ from those training recorded.
std::string loadTrainedWeights(models::Model& model, const JobConfig& job, const RunDir& runDir);

// model.lora: the frozen weights the adapters were trained beside
// (model.init_from, or without it runDir's model/base.pt) loaded into
// `model`, then attachLora. Returns the file they came from; throws
// DataError when base.pt is missing.
std::string loadLoraBase(models::Model& model, const JobConfig& job, const RunDir& runDir);

// Compares the frozen weights of `model` with the digest training recorded
// (a checkpoint manifest's extra.lora_base_digest, or summary.json's;
// "": nothing to compare): adapters over other weights compute what nobody
// trained. Throws DataError naming `where` and `base`.
void checkLoraBase(const models::Model& model, const std::string& recorded, const std::string& where,
                   const std::string& base);

}  // namespace cohort::infer
