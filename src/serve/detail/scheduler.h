#pragma once

// Continuous batching for `cohort serve`'s generations (iteration-level
// scheduling, as Orca and vLLM do), for a predictor that decodes with a
// key/value cache. docs/deploy.md, "Continuous batching and the paged cache".
//
// Design: one model thread owns the running sequences, each with its cache
// in one shared KvPool (blocks of `blockTokens` positions). Each iteration:
//
//   drop the sequences whose handler cancelled them (their blocks go back)
//   admit waiting requests, oldest first, while fewer than maxRows run
//     (when nothing runs, first wait for maxRows requests or maxDelay after
//     the oldest one, as the Batcher waits for a batch to fill)
//   feed each running sequence its tokens the model has not seen: one for a
//     sequence under way; its prompt (or a context shift's refill) for a new
//     one, in chunks: every sequence gets at least one token, and beyond one
//     a sequence the iteration's tokens stay within stepTokens (a long
//     prompt is prefilled over several iterations rather than stalling the
//     others)
//   one Predictor::decode over all of them
//   for each sequence whose input is all in: sample its next token with its
//     own generator (infer::sampleNext, seeded by the request), record its
//     TokenChoice when asked, and hand it to the request's channel; a
//     sequence that reached max_tokens leaves, its blocks freed now
//
// A handler waits on its channel (Ticket::next, bounded) and cancels it
// when it is done with it early (a stop string, the client gone, the drain
// limit): the sequence leaves at the next iteration. The same request gives
// the same tokens as alone: each row's logits do not depend on the others
// (up to float rounding), and its generator is its own.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cohort/infer/decoding.h"
#include "cohort/models/kv_cache.h"
#include "cohort/serve/model.h"
#include "serve/detail/generation.h"
#include "serve/detail/request.h"
#include "serve/detail/serve_metrics.h"

namespace cohort::serve::detail {

struct SchedulerOptions {
  int64_t maxRows = 16;     // sequences running together (--max-batch)
  std::chrono::microseconds maxDelay{5000};  // when idle: how long the first request waits for others
  int64_t maxWaiting = 256;  // requests waiting to be admitted (--max-queue)
  int64_t stepTokens = 512;  // tokens of one iteration beyond one per sequence (--max-step-tokens)
  int64_t blockTokens = models::kKvBlockTokens;  // positions per cache block (--kv-block-tokens)
  int64_t blockSize = 0;     // the model's context
  int64_t vocab = 0;         // logits sampled from: the first `vocab` (the tokenizer's ids); 0: all
  int computeThreads = 0;    // intra-op threads of the model thread; 0: LibTorch's default
};

// One request's side of the scheduler: the tokens as they come.
class Ticket {
 public:
  // The next token, waiting at most `timeout`: true with `out` set; false
  // when none came within it. Throws what the iteration threw (the forward
  // failed), or Unavailable when the scheduler stopped.
  bool next(TokenChoice& out, std::chrono::milliseconds timeout);
  // The request is done with the scheduler: its sequence leaves at the next
  // iteration (or is never admitted). Non-blocking; idempotent.
  void cancel();
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class Scheduler;
  void push(TokenChoice c);
  void fail(std::exception_ptr e);

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<TokenChoice> tokens_;
  std::exception_ptr error_;
  std::atomic<bool> cancelled_{false};
};

class Scheduler {
 public:
  // Starts the model thread; `predictor` (which must decode) and `metrics`
  // must outlive the Scheduler.
  Scheduler(Predictor& predictor, SchedulerOptions options, ServeMetrics& metrics);
  // Stops the model thread (after its current iteration) and fails what is
  // waiting or running with Unavailable.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues `request` (its prompt checked by the parser: 1 to block_size
  // ids within the vocabulary). nullptr when maxWaiting requests already
  // wait (the caller answers 503). The ticket gives request.maxTokens
  // tokens unless cancelled.
  std::shared_ptr<Ticket> submit(const GenerateRequest& request);

  // The server drains: nothing new will come, so an idle scheduler no
  // longer waits for more requests before it starts. Non-blocking.
  void drain();

  // The pool the sequences' caches share.
  const models::KvPool& pool() const { return *pool_; }

 private:
  struct Running;
  void loop();
  // One iteration over `running_`; the model thread's alone.
  void iterate();
  // Predictor::decode of `rows`, the single tokens apart from the longer
  // rows (no row padded to a prompt's length); logits [rows, vocab] float.
  at::Tensor decodeApart(const std::vector<at::Tensor>& rows, const std::vector<models::KvCache*>& caches);
  void publish(int64_t waiting);

  Predictor& predictor_;
  const SchedulerOptions options_;
  ServeMetrics& metrics_;
  std::shared_ptr<models::KvPool> pool_;
  std::mutex mutex_;
  std::condition_variable cv_;
  struct Waiting;
  std::deque<std::unique_ptr<Waiting>> waiting_;
  bool stopping_ = false;
  bool draining_ = false;
  std::vector<std::unique_ptr<Running>> running_;  // the model thread's
  std::thread thread_;
};

}  // namespace cohort::serve::detail
