#pragma once

// `cohort generate RUN_DIR`: text from a trained language model, so a person
// can see what it learned.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/models/model.h"
#include "cohort/train/decoding.h"

namespace cohort::train {

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

struct GenerateOptions {
  std::string runDir;
  std::string prompt;        // encoded with the training data's tokenizer; empty: a newline
  int64_t tokens = 200;      // tokens to generate, at most
  Sampling sampling;
  std::vector<std::string> stops;  // the text ends before the first of them
  bool kvCache = true;       // false: the whole window again for every token (to compare)
  std::ostream* timing = nullptr;  // when set: a line of tokens/s and first-token latency
};

// Loads RUN_DIR's resolved job, builds its model (model.arch: gpt) with the
// weights of model/final.pt (or .safetensors) or, before that exists, of
// the newest valid checkpoint, and writes to `out` the prompt, then each
// sampled token's text as it comes (held back while it may begin a stop
// string), until `tokens` tokens or a stop string. Returns 0; throws
// UsageError (not a language model, bad options) or DataError (no weights,
// unreadable files) naming the file.
int generateCommand(const GenerateOptions& options, std::ostream& out);

}  // namespace cohort::train
