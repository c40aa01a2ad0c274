#pragma once

// `cohort generate RUN_DIR`: text from a trained language model, so a person
// can see what it learned.

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/infer/decoding.h"
#include "cohort/models/model.h"

namespace cohort::infer {

struct GenerateOptions {
  std::string runDir;
  std::string prompt;        // encoded with the training data's tokenizer; empty: a newline
  int64_t tokens = 200;      // tokens to generate, at most
  Sampling sampling;
  std::vector<std::string> stops;  // the text ends before the first of them
  bool kvCache = true;       // false: the whole window again for every token (to compare)
  std::ostream* timing = nullptr;  // when set: a line of tokens/s and first-token latency
  // When set, the model to sample from instead of building the run's (a
  // split model's front, `cohort generate --procs N`); `modelWeights` says
  // where its weights are, for the first line.
  std::shared_ptr<models::Model> model;
  std::string modelWeights;
};

// Loads RUN_DIR's resolved job, builds its model (model.arch: gpt) with the
// weights of model/final.pt (or .safetensors) or, before that exists, of
// the newest valid checkpoint, and writes to `out` the prompt, then each
// sampled token's text as it comes (held back while it may begin a stop
// string), until `tokens` tokens or a stop string. Returns 0; throws
// UsageError (not a language model, bad options) or DataError (no weights,
// unreadable files) naming the file.
int generateCommand(const GenerateOptions& options, std::ostream& out);

}  // namespace cohort::infer
