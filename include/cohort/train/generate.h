#pragma once

// `cohort generate RUN_DIR`: text from a trained language model, so a person
// can see what it learned.

#include <cstdint>
#include <ostream>
#include <string>

#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/models/model.h"

namespace cohort::train {

// Loads into `model` (built from `job`) the run's trained weights: those of
// model/final.pt, or a LoRA run's model.init_from with model/adapters.pt, or
// the newest valid checkpoint. Returns where they came from; throws
// DataError when there are none.
std::string loadTrainedWeights(models::Model& model, const JobConfig& job, const RunDir& runDir);

struct GenerateOptions {
  std::string runDir;
  std::string prompt;        // encoded with the training data's tokenizer; empty: a newline
  int64_t tokens = 200;      // tokens to generate
  double temperature = 1.0;  // logits are divided by it; 0: always the most likely token
  int64_t topK = 0;          // sample among the k most likely tokens; 0: all
  uint64_t seed = 0;
};

// Loads RUN_DIR's resolved job, builds its model (model.arch: gpt) with the
// weights of model/final.pt or, before that exists, of the newest valid
// checkpoint, and writes the prompt followed by `tokens` sampled tokens to
// `out`, decoded. Returns 0; throws UsageError (not a language model, bad
// options) or DataError (no weights, unreadable files) naming the file.
int generateCommand(const GenerateOptions& options, std::ostream& out);

}  // namespace cohort::train
