#pragma once

// Builds batches on background threads, ahead of the trainer, and hands
// them out in order.

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cohort/data/dataset.h"
#include "cohort/data/transform.h"

namespace cohort::data {

struct Batch {
  // Images: float32 [B, C, H, W] and labels int64 [B]. Tokens (windows of
  // T + 1): the first T of each window, int64 [B, T], and the last T as
  // labels, int64 [B, T].
  at::Tensor inputs;
  at::Tensor labels;
  int64_t index = 0;  // position in the epoch
  int64_t skipped = 0;  // corrupt samples left out of this batch (on_corrupt: skip)
};

struct LoaderOptions {
  int64_t batchSize = 32;
  int threads = 2;
  int prefetch = 4;     // batches built ahead of the consumer
  bool dropLast = false;
  // Without dropLast: a rank with one sample more than the others (an
  // exact-tail sampler's extra one, startEpoch's `shared`) whose extra
  // sample would make a batch of its own puts it into the batch before
  // instead, so this rank has as many batches as the others.
  bool absorbTail = false;
  uint64_t seed = 0;    // augmentation seed
  Transform transform;
  // Masked language modelling (bert's pretraining) on token windows, when
  // maskId >= 0: the inputs are the whole windows with 15% of their
  // positions chosen, each chosen one becoming maskId (80%), a token drawn
  // uniformly below vocabSize (10%) or staying (10%); the labels are the
  // chosen positions' tokens and kIgnoredLabel elsewhere. Drawn from
  // (seed, epoch, sample) as augmentation is, so a resumed run masks the
  // same positions.
  int64_t maskId = -1;
  int64_t vocabSize = 0;
};

// The label of a position no loss is taken at (PyTorch's cross-entropy's
// default ignore_index).
inline constexpr int64_t kIgnoredLabel = -100;

// Design: `threads` workers take batch numbers in order from a shared
// counter, never more than `prefetch` ahead of the consumer, and put finished
// batches in a map keyed by number; next() waits for its number. Random
// augmentation is seeded by (seed, epoch, sample), so batches do not depend
// on which thread built them or when.
class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~BatchLoader();  // stops and joins the threads
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Starts an epoch over `indices` (this rank's samples, in visiting order),
  // at batch `firstBatch` (a resumed run: the batches before it are neither
  // read nor built). Unconsumed batches of a previous epoch are dropped.
  // Tells the dataset which samples come next (Dataset::willRead).
  // `shared`: the samples every rank has this epoch (absorbTail; -1: none
  // is folded).
  void startEpoch(std::vector<int64_t> indices, int64_t epoch, int64_t firstBatch = 0, int64_t shared = -1);
  int64_t batchesInEpoch() const;
  // The next batch in order, or nullopt after the epoch's last. Blocks until
  // it is built; the time blocked is added to waitSeconds(). Rethrows the
  // first exception of a loader thread.
  std::optional<Batch> next();
  // Total seconds next() spent waiting for batches.
  double waitSeconds() const;

 private:
  void work();
  void stopThreads();
  // Batch `number` of the epoch: indices [number x batch size, end).
  Batch build(int64_t number, const std::vector<int64_t>& indices, int64_t epoch, int64_t end) const;
  // absorbTail applies to an epoch of `n` samples (`shared_` on every rank).
  // Both under mutex_.
  bool absorbs(int64_t n) const;
  int64_t batchEnd(int64_t number, int64_t n) const;
  int64_t shared_ = -1;

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  std::shared_ptr<const std::vector<int64_t>> indices_;
  int64_t epoch_ = 0;
  int64_t batches_ = 0;
  int64_t nextToBuild_ = 0;
  int64_t consumed_ = 0;
  std::map<int64_t, Batch> ready_;
  std::exception_ptr error_;
  double waitSeconds_ = 0;
};

}  // namespace cohort::data
