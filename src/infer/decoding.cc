#include "cohort/infer/decoding.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "cohort/core/error.h"

namespace cohort::infer {

void checkSampling(const Sampling& s, const std::string& prefix) {
  if (!(s.temperature >= 0)) {
    throw UsageError(fmt::format("{}temperature: must be >= 0, got {}", prefix, s.temperature));
  }
  if (s.topK < 0) throw UsageError(fmt::format("{}top-k: must be >= 0, got {}", prefix, s.topK));
  if (!(s.topP > 0 && s.topP <= 1)) {
    throw UsageError(fmt::format("{}top-p: must be in (0, 1], got {}", prefix, s.topP));
  }
}

int64_t sampleNext(const at::Tensor& logits, const Sampling& s, at::Generator& gen) {
  if (s.temperature < kGreedyTemperature) return logits.argmax().item<int64_t>();
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  at::Tensor scaled = logits / s.temperature;
  if (s.topK > 0 && s.topK < scaled.size(0)) {
    const at::Tensor kth = std::get<0>(scaled.topk(s.topK)).index({s.topK - 1});
    scaled = scaled.masked_fill(scaled < kth, kNone);
  }
  at::Tensor probs = torch::softmax(scaled, 0);
  if (s.topP < 1) {
    // The most likely tokens until their probabilities reach p: a token
    // goes when those before it in the order already sum to p.
    const auto [sorted, order] = probs.sort(0, /*descending=*/true);
    const at::Tensor before = sorted.cumsum(0) - sorted;
    const at::Tensor drop = torch::zeros_like(probs, torch::kBool).scatter(0, order, before >= s.topP);
    probs = probs.masked_fill(drop, 0);
  }
  return torch::multinomial(probs, 1, false, gen).item<int64_t>();
}

Sequence::Sequence(std::vector<int64_t> prompt, int64_t blockSize, bool cached, std::shared_ptr<models::KvPool> pool)
    : tokens_(std::move(prompt)), blockSize_(blockSize), cached_(cached),
      cache_(std::make_shared<models::KvCache>(std::move(pool))) {}

std::vector<int64_t> Sequence::input() {
  const size_t block = static_cast<size_t>(blockSize_);
  if (tokens_.size() - start_ > block) {
    const size_t keep = started_ ? std::max<size_t>(1, block / 2) : block;
    start_ = tokens_.size() - keep;
    cache_->clear();
  }
  started_ = true;
  const size_t from = start_ + (cached_ ? static_cast<size_t>(cache_->length) : 0);
  return {tokens_.begin() + static_cast<std::ptrdiff_t>(from), tokens_.end()};
}

at::Tensor nextLogits(models::Model& model, Sequence& seq) {
  const at::Tensor input = torch::tensor(seq.input(), torch::kInt64);
  if (seq.cached()) return model.decode({input}, {&seq.cache()}).squeeze(0).to(torch::kFloat);
  return model.forward(input.unsqueeze(0)).select(1, input.size(0) - 1).squeeze(0).to(torch::kFloat);
}

size_t findStop(const std::string& text, const std::vector<std::string>& stops) {
  size_t first = std::string::npos;
  for (const std::string& stop : stops) {
    if (!stop.empty()) first = std::min(first, text.find(stop));
  }
  return first;
}

size_t stopPrefix(const std::string& text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const std::string& stop : stops) {
    for (size_t n = std::min(stop.size() - (stop.empty() ? 0 : 1), text.size()); n > held; --n) {
      if (text.compare(text.size() - n, n, stop, 0, n) == 0) {
        held = n;
        break;
      }
    }
  }
  return held;
}

}  // namespace cohort::infer
