#pragma once

// Dynamic batching for `cohort serve`: HTTP workers submit single inputs, one
// model thread runs them together.
//
// Design: a FIFO of inputs, each with its own promise. The model thread takes
// the oldest input and waits until `maxBatch` inputs of the same shape are
// queued, or `maxDelay` has passed since the oldest arrived (or the server
// drains), or no other request could join: every request in flight
// (ServeMetrics::inFlight, counted by the handlers) has its inputs queued
// already, so waiting would only add the delay (one client pays none; under
// load batches form as before). Then it stacks up to `maxBatch` inputs of the oldest one's shape
// (others wait for the next round, keeping their place), runs one forward,
// and fulfils each promise with that input's row of the logits. Inputs of one
// shape: an image model's inputs all share it; a language model's contexts
// are grouped by length. Generation steps with a key/value cache
// (submitDecode) all run together, whatever the length of their sequences
// and of their new tokens (a prompt beside single tokens): concurrent
// generations share every forward (Predictor::decode). `cohort serve`
// batches those token by token in its scheduler instead (scheduler.h);
// submitDecode serves a ServeState without one.
// The predictor is only ever called from this thread.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cohort/serve/model.h"
#include "serve/detail/serve_metrics.h"

namespace cohort::serve::detail {

struct BatcherOptions {
  int64_t maxBatch = 16;
  std::chrono::microseconds maxDelay{5000};
  int64_t maxQueue = 256;  // inputs waiting, at most
  int computeThreads = 0;  // intra-op threads of the model thread; 0: LibTorch's default
  // Wait out maxDelay even when every request in flight is queued (a
  // lone request waits for company that is not coming): for tests that
  // hold requests in the queue.
  bool waitAlone = false;
};

class Batcher {
 public:
  // Starts the model thread; `predictor` and `metrics` must outlive the Batcher.
  Batcher(Predictor& predictor, BatcherOptions options, ServeMetrics& metrics);
  // Runs what is queued, then stops and joins the model thread.
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues `inputs` (each one sample without the batch dimension: pixels
  // [C, H, W] float, or token ids [T] int64) all or none. Returns one future
  // per input: an image model's logits [classes]; a language model's logits
  // of the last position [vocab]. A future throws what the forward threw
  // (DataError for an input the model refuses). Returns an empty vector when
  // the queue has no room for them all (the caller answers 503).
  std::vector<std::future<at::Tensor>> submit(std::vector<at::Tensor> inputs);

  // Queues `tokens` [T] that continue the sequence of `cache`, for a
  // predictor that decodes. The future gives the logits of the last token
  // [vocab] once `cache` holds the T positions too; `cache` is the model
  // thread's until then (kept alive by it, should the caller give up
  // waiting). Invalid (no state) when the queue is full.
  std::future<at::Tensor> submitDecode(at::Tensor tokens, std::shared_ptr<models::KvCache> cache);

  // The sequence of `cache` ended (Predictor::endSequence). Thread-safe.
  void endSequence(const models::KvCache& cache) { predictor_.endSequence(cache); }

  // The server drains: no new request will fill a batch, so from now on
  // batches run as soon as an input waits, without maxDelay. Non-blocking.
  void drain();

  // A request in flight was answered (the handlers call it once they have
  // lowered ServeMetrics::inFlight): a batch waiting for it to join may run
  // now. Non-blocking.
  void requestDone();

 private:
  struct Item {
    at::Tensor input;
    std::promise<at::Tensor> result;
    std::chrono::steady_clock::time_point arrived;
    std::shared_ptr<models::KvCache> cache;  // submitDecode
    uint64_t request = 0;  // the submit() call, numbered from 1; 0: submitDecode's
    // Items that may share a batch.
    bool joins(const Item& o) const {
      if (cache != nullptr || o.cache != nullptr) return cache != nullptr && o.cache != nullptr;
      return input.sizes() == o.input.sizes();
    }
  };
  void loop();
  // Requests with inputs in the queue (those of one submit() stay adjacent).
  int64_t queuedRequests() const;
  void run(std::vector<Item>& batch);

  Predictor& predictor_;
  const BatcherOptions options_;
  ServeMetrics& metrics_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  bool draining_ = false;  // drain(): no waiting for a batch to fill
  uint64_t requests_ = 0;  // submit() calls so far
  std::thread thread_;
};

}  // namespace cohort::serve::detail
