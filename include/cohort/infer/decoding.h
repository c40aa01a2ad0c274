#pragma once

// What `cohort generate` and `cohort serve`'s /v1/generate share: how the
// next token is drawn from the logits, which of a sequence's tokens the
// model sees, and where a stop string ends the text. The same prompt,
// options and seed give the same tokens through either, with the key/value
// cache or without it.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/models/model.h"

namespace cohort::infer {

// Below this temperature sampling is greedy: the most likely token (dividing
// the logits by less would overflow float). 0 is the usual way to ask for it.
inline constexpr double kGreedyTemperature = 1e-4;

struct Sampling {
  double temperature = 1.0;  // logits are divided by it; below kGreedyTemperature: the most likely token
  int64_t topK = 0;          // only the k most likely tokens (ties with the k-th kept); 0: all
  double topP = 1.0;         // only the most likely tokens whose probabilities reach p together; 1: all
  uint64_t seed = 0;
};

// Throws UsageError naming the option (`prefix` + temperature, top_k,
// top_p) when a setting is out of range.
void checkSampling(const Sampling& s, const std::string& prefix);

// The next token from the logits of the last position (`logits` [vocab]
// float): greedy below kGreedyTemperature; else the logits divided by the
// temperature, cut to the top k, then to the top p (nucleus), and one
// token drawn from `gen`.
int64_t sampleNext(const at::Tensor& logits, const Sampling& s, at::Generator& gen);

// One sequence being generated: its tokens, the window of them the model
// sees (at most block_size, the newest), and with a model that decodes
// (Model::decode), the key/value cache of that window.
//
// When a new token would make the window longer than block_size, the
// window is cut to its newest block_size / 2 tokens and the cache is filled
// again from them: one longer forward every block_size / 2 tokens, not
// one per token (a "context shift"). Without a cache the model gets the
// same window every time, so both give the same logits. The first window
// of a prompt longer than block_size is its last block_size tokens.
class Sequence {
 public:
  // `pool`: where the cache takes its blocks (shared with other sequences);
  // nullptr: a private pool of its own.
  Sequence(std::vector<int64_t> prompt, int64_t blockSize, bool cached,
           std::shared_ptr<models::KvPool> pool = nullptr);

  // What the model takes next: with the cache, the window's tokens it has
  // not seen (one, but all of them at the start or after a shift), to feed
  // to decode() with cache(); without, the whole window for forward().
  std::vector<int64_t> input();
  models::KvCache& cache() { return *cache_; }
  // Shared with a model thread that may outlive the sequence (cohort serve).
  const std::shared_ptr<models::KvCache>& sharedCache() const { return cache_; }
  bool cached() const { return cached_; }

  void append(int64_t token) { tokens_.push_back(token); }
  const std::vector<int64_t>& tokens() const { return tokens_; }

 private:
  std::vector<int64_t> tokens_;
  size_t start_ = 0;  // the window is tokens_[start_, end)
  int64_t blockSize_;
  bool cached_;
  bool started_ = false;
  std::shared_ptr<models::KvCache> cache_;
};

// The logits [vocab] (float) for `seq`'s next token: one decode() of its
// new tokens with its cache, or one forward() of its window.
at::Tensor nextLogits(models::Model& model, Sequence& seq);

// Where the first of `stops` begins in `text`; std::string::npos when none
// is there.
size_t findStop(const std::string& text, const std::vector<std::string>& stops);
// How many bytes at the end of `text` begin some stop string: what a
// stream holds back until the next token shows whether a stop follows.
size_t stopPrefix(const std::string& text, const std::vector<std::string>& stops);

}  // namespace cohort::infer
