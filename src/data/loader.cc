#include "cohort/data/loader.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "cohort/core/error.h"
#include "data/detail/random.h"

namespace cohort::data {

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  COHORT_ASSERT(options_.batchSize > 0 && options_.threads > 0 && options_.prefetch > 0,
                "bad loader options");
  try {
    for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { work(); });
  } catch (...) {
    stopThreads();
    throw;
  }
}

BatchLoader::~BatchLoader() { stopThreads(); }

void BatchLoader::stopThreads() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool BatchLoader::absorbs(int64_t n) const {
  return options_.absorbTail && !options_.dropLast && shared_ > 0 && n == shared_ + 1 &&
         shared_ % options_.batchSize == 0;
}

void BatchLoader::startEpoch(std::vector<int64_t> indices, int64_t epoch, int64_t firstBatch, int64_t shared) {
  {
    const size_t from = static_cast<size_t>(std::clamp<int64_t>(
        firstBatch * options_.batchSize, 0, static_cast<int64_t>(indices.size())));
    dataset_->willRead(std::vector<int64_t>(indices.begin() + static_cast<std::ptrdiff_t>(from),
                                            indices.end()));
  }
  {
    std::lock_guard<std::mutex> g(mutex_);
    ++generation_;
    const int64_t n = static_cast<int64_t>(indices.size());
    shared_ = shared;
    batches_ = options_.dropLast ? n / options_.batchSize
                                 : (n + options_.batchSize - 1) / options_.batchSize;
    if (absorbs(n)) batches_ = shared_ / options_.batchSize;
    indices_ = std::make_shared<const std::vector<int64_t>>(std::move(indices));
    epoch_ = epoch;
    nextToBuild_ = std::clamp<int64_t>(firstBatch, 0, batches_);
    consumed_ = nextToBuild_;
    ready_.clear();
    error_ = nullptr;  // an error of an abandoned epoch is not this epoch's
  }
  cv_.notify_all();
}

int64_t BatchLoader::batchesInEpoch() const {
  std::lock_guard<std::mutex> g(mutex_);
  return batches_;
}

double BatchLoader::waitSeconds() const {
  std::lock_guard<std::mutex> g(mutex_);
  return waitSeconds_;
}

std::optional<Batch> BatchLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  if (consumed_ >= batches_) return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  cv_.wait(lock, [&] { return error_ || ready_.count(consumed_) > 0; });
  waitSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (error_) std::rethrow_exception(error_);
  auto node = ready_.extract(consumed_);
  ++consumed_;
  lock.unlock();
  cv_.notify_all();
  return std::move(node.mapped());
}

void BatchLoader::work() {
  for (;;) {
    int64_t number = 0;
    uint64_t generation = 0;
    int64_t epoch = 0;
    int64_t end = 0;
    std::shared_ptr<const std::vector<int64_t>> indices;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] {
        return stop_ || (!error_ && nextToBuild_ < batches_ &&
                         nextToBuild_ < consumed_ + options_.prefetch);
      });
      if (stop_) return;
      number = nextToBuild_++;
      generation = generation_;
      epoch = epoch_;
      indices = indices_;
      end = batchEnd(number, static_cast<int64_t>(indices->size()));
    }
    try {
      Batch b = build(number, *indices, epoch, end);
      std::lock_guard<std::mutex> g(mutex_);
      if (generation == generation_) ready_.emplace(number, std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> g(mutex_);
      if (generation == generation_ && !error_) error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

int64_t BatchLoader::batchEnd(int64_t number, int64_t n) const {
  if (absorbs(n) && number == shared_ / options_.batchSize - 1) return n;
  return std::min<int64_t>((number + 1) * options_.batchSize, n);
}

Batch BatchLoader::build(int64_t number, const std::vector<int64_t>& indices, int64_t epoch, int64_t end) const {
  const int64_t begin = number * options_.batchSize;
  const int64_t count = end - begin;
  const SampleShape s = dataset_->shape();
  Batch b;
  b.index = number;
  auto seedOf = [&](int64_t sample) {
    return detail::mix(options_.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(sample));
  };
  if (dataset_->kind() == SampleKind::tokens) {
    const int64_t window = s.width;
    at::Tensor windows = torch::empty({count, window}, torch::kInt64);
    int64_t* w = windows.data_ptr<int64_t>();
    // One seed per epoch, not per window: every window of the epoch moves
    // by the same offset, so they still tile the text.
    const uint64_t epochSeed = detail::mix(options_.seed, static_cast<uint64_t>(epoch));
    for (int64_t i = 0; i < count; ++i) {
      dataset_->readTokens(indices[static_cast<size_t>(begin + i)], w + i * window, epochSeed);
    }
    if (options_.maskId >= 0) {
      b.labels = torch::full({count, window}, kIgnoredLabel, torch::kInt64);
      int64_t* lab = b.labels.data_ptr<int64_t>();
      for (int64_t i = 0; i < count; ++i) {
        detail::Rng rng(seedOf(indices[static_cast<size_t>(begin + i)]));
        for (int64_t k = i * window; k < (i + 1) * window; ++k) {
          if (rng.uniform() >= 0.15f) continue;
          lab[k] = w[k];
          const float u = rng.uniform();
          if (u < 0.8f) {
            w[k] = options_.maskId;
          } else if (u < 0.9f) {
            w[k] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(options_.vocabSize)));
          }
        }
      }
      b.inputs = windows;
      return b;
    }
    b.inputs = windows.narrow(1, 0, window - 1).contiguous();
    b.labels = windows.narrow(1, 1, window - 1).contiguous();
    return b;
  }
  if (dataset_->kind() == SampleKind::text) {
    b.inputs = torch::empty({count, s.width}, torch::kInt64);
    b.labels = torch::empty({count}, torch::kInt64);
    int64_t* in = b.inputs.data_ptr<int64_t>();
    int64_t* lab = b.labels.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      lab[i] = dataset_->readText(indices[static_cast<size_t>(begin + i)], in + i * s.width);
    }
    return b;
  }
  b.inputs = torch::empty({count, s.channels, s.height, s.width}, torch::kFloat32);
  b.labels = torch::empty({count}, torch::kInt64);
  float* img = b.inputs.data_ptr<float>();
  int64_t* lab = b.labels.data_ptr<int64_t>();
  std::vector<float> scratch(static_cast<size_t>(s.numel()));
  int64_t kept = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t sample = indices[static_cast<size_t>(begin + i)];
    float* out = img + kept * s.numel();
    const uint64_t seed = seedOf(sample);
    const int64_t label = dataset_->read(sample, out, seed);
    if (label == kSkippedSample) {
      ++b.skipped;
      continue;
    }
    lab[kept++] = label;
    applyTransform(options_.transform, s, out, scratch.data(), seed);
  }
  if (kept == 0) {
    throw DataError(fmt::format("every one of the {} samples of batch {} in epoch {} is corrupt "
                                "(see the warnings naming them)", count, number, epoch));
  }
  if (kept < count) {
    b.inputs = b.inputs.narrow(0, 0, kept).contiguous();
    b.labels = b.labels.narrow(0, 0, kept).contiguous();
  }
  return b;
}

}  // namespace cohort::data
