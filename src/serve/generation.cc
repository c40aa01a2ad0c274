#include "serve/detail/generation.h"

#include <torch/torch.h>

#include <algorithm>

#include "serve/detail/scheduler.h"

namespace cohort::serve::detail {

at::Tensor waitResult(const ServeState& s, std::future<at::Tensor>& f) {
  const auto deadline = std::chrono::steady_clock::now() + kResultTimeout;
  while (f.wait_for(kStoppingCheck) != std::future_status::ready) {
    if (s.stopping.load()) {
      throw Unavailable("the server is shutting down and the drain limit (--drain-seconds) has passed");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error("the model did not answer within 5 minutes");
    }
  }
  return f.get();
}

TokenChoice choiceOf(const at::Tensor& logits, int64_t token, int64_t top) {
  const at::Tensor logp = torch::log_softmax(logits.to(torch::kDouble), 0);
  TokenChoice c;
  c.token = token;
  c.logprob = logp[token].item<double>();
  const int64_t k = std::min<int64_t>(top, logp.size(0));
  if (k > 0) {
    const auto [values, ids] = logp.topk(k);
    for (int64_t i = 0; i < k; ++i) c.top.emplace_back(ids[i].item<int64_t>(), values[i].item<double>());
  }
  return c;
}

Generation::Generation(GenerateRequest r, const ServeState& s, bool cached)
    : request(std::move(r)), seq(request.prompt, s.info.blockSize, cached), promptTokens(request.prompt.size()),
      generator(at::make_generator<at::CPUGeneratorImpl>(request.sampling.seed)), batcher(s.batcher) {}

Generation::~Generation() {
  cancel();
  // Without the scheduler, this generation's own cache was the sequence's.
  if (ticket_ == nullptr && seq.cached()) batcher.endSequence(seq.cache());
}

void Generation::cancel() {
  if (ticket_ != nullptr) ticket_->cancel();
}

void Generation::step(ServeState& s) {
  if (s.stopping.load()) {
    cancel();
    throw Unavailable("the server is shutting down and the drain limit (--drain-seconds) has passed");
  }
  if (seq.cached() && s.scheduler != nullptr) {
    stepScheduled(s);
    return;
  }
  const at::Tensor input = torch::tensor(seq.input(), torch::kInt64);
  std::future<at::Tensor> future;
  if (seq.cached()) {
    future = s.batcher.submitDecode(input, seq.sharedCache());
  } else if (auto futures = s.batcher.submit({input}); !futures.empty()) {
    future = std::move(futures[0]);
  }
  if (!future.valid()) throw Unavailable("the queue of inputs is full; retry later");
  const int64_t vocab = s.info.tokenizerVocab > 0 ? std::min(s.info.tokenizerVocab, s.info.vocabSize)
                                                  : s.info.vocabSize;
  const at::Tensor logits = waitResult(s, future).narrow(0, 0, vocab);
  const int64_t token = infer::sampleNext(logits, request.sampling, generator);
  seq.append(token);
  if (request.logprobs >= 0) choices.push_back(choiceOf(logits, token, request.logprobs));
  ++generated;
  text = textTokenizer(s.info).decode(completion());
  if (const size_t stop = infer::findStop(text, request.stops); stop != std::string::npos) {
    text.resize(stop);
    stopped = true;
  }
}

void Generation::stepScheduled(ServeState& s) {
  if (ticket_ == nullptr) {
    ticket_ = s.scheduler->submit(request);
    if (ticket_ == nullptr) throw Unavailable("the queue of generations is full; retry later");
  }
  TokenChoice c;
  const auto deadline = std::chrono::steady_clock::now() + kResultTimeout;
  while (!ticket_->next(c, std::chrono::duration_cast<std::chrono::milliseconds>(kStoppingCheck))) {
    if (s.stopping.load()) {
      cancel();
      throw Unavailable("the server is shutting down and the drain limit (--drain-seconds) has passed");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      cancel();
      throw Error("the model did not answer within 5 minutes");
    }
  }
  seq.append(c.token);
  if (request.logprobs >= 0) choices.push_back(std::move(c));
  ++generated;
  text = textTokenizer(s.info).decode(completion());
  if (const size_t stop = infer::findStop(text, request.stops); stop != std::string::npos) {
    text.resize(stop);
    stopped = true;
    cancel();  // no more tokens of it: its place in the batch goes now
  }
}

std::vector<int64_t> Generation::completion() const {
  return {seq.tokens().begin() + static_cast<std::ptrdiff_t>(promptTokens), seq.tokens().end()};
}

std::string Generation::prefixText(const ServeState& s, size_t n) const {
  const std::vector<int64_t> all = completion();
  return textTokenizer(s.info).decode({all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n)});
}

size_t Generation::tokensWithin(const ServeState& s, size_t bytes) const {
  const size_t all = completion().size();
  size_t n = sentTokens;
  while (n < all && prefixText(s, n + 1).size() <= bytes) ++n;
  return n;
}

std::string Generation::settledLines(const ServeState& s) {
  const size_t ready = done() ? text.size() : text.size() - infer::stopPrefix(text, request.stops);
  const size_t upTo = tokensWithin(s, ready);
  const std::vector<int64_t> all = completion();
  std::string lines, before = prefixText(s, sentTokens);
  for (; sentTokens < upTo; ++sentTokens) {
    const std::string after = prefixText(s, sentTokens + 1);
    const std::string added = after.compare(0, before.size(), before) == 0 ? after.substr(before.size()) : after;
    lines += dumpJson({{"token", all[sentTokens]}, {"text", added}}) + "\n";
    before = after;
  }
  return lines;
}

nlohmann::json Generation::summary(const ServeState& s) const {
  std::vector<int64_t> out = completion();
  if (stopped) out.resize(tokensWithin(s, text.size()));
  return {{"text", text}, {"tokens", out}, {"prompt_tokens", request.prompt.size()},
          {"finish_reason", stopped ? "stop" : "length"}};
}

}  // namespace cohort::serve::detail
