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

// Below this temperature sampling is greedy: the most likely token (dividing
// the logits by less would overflow float). 0 is the usual way to ask for it.
inline constexpr double kGreedyTemperature = 1e-4;

// The next token from the logits of the last position (`logits` [vocab]
// float): greedy below kGreedyTemperature, else a draw from `gen` after
// dividing by `temperature` and, with 0 < topK < vocab, keeping the topK
// largest logits (ties with the k-th kept). What `cohort generate` and
// `cohort serve`'s /v1/generate both sample with: the same logits, options
// and generator state give the same token.
int64_t sampleNext(const at::Tensor& logits, double temperature, int64_t topK, at::Generator& gen);

// The model's input for the next token: the last `blockSize` of `tokens`.
std::vector<int64_t> contextWindow(const std::vector<int64_t>& tokens, int64_t blockSize);

struct GenerateOptions {
  std::string runDir;
  std::string prompt;        // encoded with the training data's tokenizer; empty: a newline
  int64_t tokens = 200;      // tokens to generate
  double temperature = 1.0;  // logits are divided by it; below kGreedyTemperature (0): the most likely token
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
