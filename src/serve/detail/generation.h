#pragma once

// One generation of `cohort serve`, as the handlers drive it: the prompt
// and the tokens so far, sampled one at a time through the batcher, the
// completion's text cut at a stop string, and the stream lines of the
// tokens that are settled. /v1/generate and the OpenAI routes share it.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/CPUGeneratorImpl.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/infer/decoding.h"
#include "serve/detail/handlers.h"
#include "serve/detail/request.h"

namespace cohort::serve::detail {

// How long a handler waits for the model thread before it answers 500: only
// reached when a forward hangs.
inline constexpr auto kResultTimeout = std::chrono::minutes(5);
// How often a handler waiting for the model looks at ServeState::stopping.
inline constexpr auto kStoppingCheck = std::chrono::milliseconds(50);

// The server cannot take or finish the work now: the queue is full, or the
// drain limit passed. Answered 503; anything else a handler throws is 500.
class Unavailable : public Error {
 public:
  using Error::Error;
};

// The model's answer for one input. Throws Unavailable once the drain limit
// has passed (ServeState::stopping), Error after kResultTimeout (a hung
// forward), and what the forward threw.
at::Tensor waitResult(const ServeState& s, std::future<at::Tensor>& f);

// A sampled token with its log-probability under the model (the logits
// before temperature, top_k and top_p), and the most likely tokens at its
// place with theirs, most likely first (GenerateRequest::logprobs of them).
struct TokenChoice {
  int64_t token = 0;
  double logprob = 0;
  std::vector<std::pair<int64_t, double>> top;
};

// `token`'s choice from the logits [vocab] it was sampled from, with the
// `top` most likely tokens.
TokenChoice choiceOf(const at::Tensor& logits, int64_t token, int64_t top);

class Ticket;

// One generation: with a model that decodes, the scheduler (scheduler.h)
// runs it in its batch of generations, each with its key/value cache, and
// step() takes its next token from there; otherwise each step is the whole
// window through the batcher, with contexts of the same length together.
struct Generation {
  GenerateRequest request;
  infer::Sequence seq;
  size_t promptTokens;
  int64_t generated = 0;
  at::Generator generator;
  std::string text;       // the completion's, cut before a stop string
  bool stopped = false;   // at a stop string
  size_t sentTokens = 0;  // streamed so far
  // With request.logprobs >= 0: one per completion token, in order.
  std::vector<TokenChoice> choices;

  Batcher& batcher;  // told when the sequence ends (Predictor::endSequence)

  Generation(GenerateRequest r, const ServeState& s, bool cached);
  // Leaves the scheduler (cancel()).
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  bool done() const { return stopped || generated >= request.maxTokens; }

  // Samples and appends the next token, as `cohort generate` does (the
  // same infer::sampleNext and window). Throws Unavailable when the queue
  // is full or the drain limit has passed; what the forward threw otherwise.
  // With the scheduler: the first step queues the generation there, each
  // step waits for its next token (checking ServeState::stopping every
  // kStoppingCheck, at most kResultTimeout).
  void step(ServeState& s);
  // The generation is given up (the client went away): the scheduler drops
  // it, and frees its cache, at its next iteration. Idempotent.
  void cancel();

  std::vector<int64_t> completion() const;
  // The text of the completion's first `n` tokens.
  std::string prefixText(const ServeState& s, size_t n) const;
  // The completion's tokens whose text is wholly within its first `bytes`.
  size_t tokensWithin(const ServeState& s, size_t bytes) const;

  // Stream lines of the tokens that are settled: not possibly the start of
  // a stop string (until the generation is done), and not part of one. A
  // token's text is what it adds to the text before it, so a tokenizer
  // whose pieces depend on their neighbours (a leading space) streams what
  // the summary says.
  std::string settledLines(const ServeState& s);

  // /v1/generate's answer: text, tokens, prompt_tokens, finish_reason.
  nlohmann::json summary(const ServeState& s) const;

 private:
  void stepScheduled(ServeState& s);
  std::shared_ptr<Ticket> ticket_;  // in the scheduler since the first step
};

}  // namespace cohort::serve::detail
