#pragma once

// GPT sizes for tests, in one call.

#include <cstdint>

#include "cohort/models/gpt.h"

namespace cohort::test {

inline models::GptOptions gptSizes(int64_t vocab, int64_t block, int64_t layers, int64_t heads,
                                   int64_t embd) {
  models::GptOptions o;
  o.vocabSize = vocab;
  o.blockSize = block;
  o.nLayer = layers;
  o.nHead = heads;
  o.nEmbd = embd;
  return o;
}

}  // namespace cohort::test
