#include "serve/detail/batcher.h"

#include <torch/torch.h>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::serve::detail {

Batcher::Batcher(Predictor& predictor, BatcherOptions options, ServeMetrics& metrics)
    : predictor_(predictor), options_(options), metrics_(metrics) {
  thread_ = std::thread([this] { loop(); });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::vector<std::future<at::Tensor>> Batcher::submit(std::vector<at::Tensor> inputs) {
  std::vector<std::future<at::Tensor>> futures;
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (stopping_ || static_cast<int64_t>(queue_.size() + inputs.size()) > options_.maxQueue) {
      return futures;
    }
    const auto now = std::chrono::steady_clock::now();
    const uint64_t request = ++requests_;
    for (at::Tensor& input : inputs) {
      Item item{std::move(input), {}, now, nullptr, request};
      futures.push_back(item.result.get_future());
      queue_.push_back(std::move(item));
    }
    metrics_.queueDepth = static_cast<int64_t>(queue_.size());
  }
  cv_.notify_all();
  return futures;
}

std::future<at::Tensor> Batcher::submitDecode(at::Tensor tokens, std::shared_ptr<models::KvCache> cache) {
  std::future<at::Tensor> future;
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (stopping_ || static_cast<int64_t>(queue_.size()) + 1 > options_.maxQueue) return future;
    Item item{std::move(tokens), {}, std::chrono::steady_clock::now(), std::move(cache)};
    future = item.result.get_future();
    queue_.push_back(std::move(item));
    metrics_.queueDepth = static_cast<int64_t>(queue_.size());
  }
  cv_.notify_all();
  return future;
}

void Batcher::drain() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    draining_ = true;
  }
  cv_.notify_all();
}

void Batcher::requestDone() {
  // Under the lock: the model thread is either before its check of inFlight
  // (and sees the lowered count) or waiting (and gets the notification).
  { std::lock_guard<std::mutex> g(mutex_); }
  cv_.notify_all();
}

int64_t Batcher::queuedRequests() const {
  int64_t n = 0;
  uint64_t previous = 0;
  for (const Item& item : queue_) {
    n += item.request == 0 || item.request != previous;
    previous = item.request;
  }
  return n;
}

void Batcher::loop() {
  // Set on the thread that runs the model: with OpenMP the count is the
  // calling thread's own setting.
  if (options_.computeThreads > 0) at::set_num_threads(options_.computeThreads);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    // Wait for the batch to fill, at most maxDelay after its oldest input.
    const auto deadline = queue_.front().arrived + options_.maxDelay;
    auto sameShape = [&] {
      int64_t n = 0;
      for (const Item& item : queue_) n += item.joins(queue_.front());
      return n;
    };
    // Not at all when no other request could join: every request in flight
    // is queued already (the handlers count a request from before it is
    // parsed to after its answer, and requestDone() wakes this wait when one
    // ends). Forward inputs only: generation steps keep their wait.
    const bool forward = queue_.front().cache == nullptr;
    auto nobodyElse = [&] {
      return forward && !options_.waitAlone && queuedRequests() >= metrics_.inFlight.load();
    };
    bool atOnce = false;
    while (!stopping_ && !draining_ && sameShape() < options_.maxBatch && !(atOnce = nobodyElse()) &&
           cv_.wait_until(lock, deadline) != std::cv_status::timeout) {
    }
    if (atOnce) metrics_.batchAtOnce();
    std::vector<Item> batch;
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
    for (auto it = queue_.begin(); it != queue_.end() && static_cast<int64_t>(batch.size()) < options_.maxBatch;) {
      if (it->joins(batch.front())) {
        batch.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    metrics_.queueDepth = static_cast<int64_t>(queue_.size());
    lock.unlock();
    run(batch);
    lock.lock();
  }
}

void Batcher::run(std::vector<Item>& batch) {
  const auto start = std::chrono::steady_clock::now();
  try {
    std::vector<at::Tensor> inputs;
    inputs.reserve(batch.size());
    std::vector<models::KvCache*> caches;
    for (const Item& item : batch) {
      inputs.push_back(item.input);
      caches.push_back(item.cache.get());
    }
    at::Tensor logits;
    if (batch.front().cache != nullptr) {
      logits = predictor_.decode(inputs, caches);
    } else {
      logits = predictor_.forward(torch::stack(inputs));
      if (predictor_.info().tokens) logits = logits.select(1, logits.size(1) - 1);
    }
    logits = logits.to(torch::kFloat).contiguous();
    metrics_.batch(static_cast<int64_t>(batch.size()),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    for (size_t i = 0; i < batch.size(); ++i) batch[i].result.set_value(logits[static_cast<int64_t>(i)].clone());
  } catch (...) {
    // The whole batch failed: each caller gets the error (the handlers check
    // inputs before submit: pixel shapes, prompt ids below the vocabulary;
    // so this is a bug, answered 500).
    const std::exception_ptr error = std::current_exception();
    for (Item& item : batch) {
      try {
        item.result.set_exception(error);
      } catch (const std::future_error&) {
        // Already fulfilled before the failure.
      }
    }
  }
}

}  // namespace cohort::serve::detail
