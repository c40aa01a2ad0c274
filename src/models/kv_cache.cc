#include "cohort/models/kv_cache.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

#include "cohort/core/error.h"

namespace cohort::models {

KvPool::KvPool(int64_t blockTokens) : blockTokens_(blockTokens) {
  if (blockTokens < 1) throw UsageError(fmt::format("a key/value block holds >= 1 positions, got {}", blockTokens));
}

int64_t KvPool::blocksInUse() const {
  std::lock_guard<std::mutex> g(mutex_);
  return inUse_;
}

int64_t KvPool::blocksTotal() const {
  std::lock_guard<std::mutex> g(mutex_);
  return total_;
}

int64_t KvPool::blocksReserved() const {
  std::lock_guard<std::mutex> g(mutex_);
  return reserved_;
}

int64_t KvPool::bytesPerBlock() const {
  std::lock_guard<std::mutex> g(mutex_);
  return bytesPerBlock_;
}

std::vector<int64_t> KvPool::allocate(int64_t n) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::lock_guard<std::mutex> g(mutex_);
  for (int64_t i = 0; i < n; ++i) {
    if (!free_.empty()) {
      out.push_back(free_.back());
      free_.pop_back();
    } else {
      out.push_back(total_++);
    }
  }
  inUse_ += n;
  return out;
}

void KvPool::release(const std::vector<int64_t>& blocks) {
  if (blocks.empty()) return;
  std::lock_guard<std::mutex> g(mutex_);
  free_.insert(free_.end(), blocks.rbegin(), blocks.rend());
  inUse_ -= static_cast<int64_t>(blocks.size());
}

at::Tensor& KvPool::storage(std::vector<at::Tensor>& of, size_t layer, int64_t kvHeads, int64_t headDim,
                            const at::TensorOptions& options) {
  if (of.size() <= layer) of.resize(layer + 1);
  at::Tensor& s = of[layer];
  const int64_t blocks = blocksTotal();
  const int64_t have = s.defined() ? s.size(0) / blockTokens_ : 0;
  if (blocks <= have && s.defined()) return s;
  // Grow by a quarter or more: a pool filling up copies O(log n) times, and
  // reserves at most a quarter beyond what was handed out.
  const int64_t want = std::max({blocks, have + have / 4, int64_t{4}});
  at::Tensor grown = torch::zeros({want * blockTokens_, kvHeads, headDim}, options);
  if (s.defined()) grown.narrow(0, 0, s.size(0)).copy_(s);
  s = grown;
  int64_t bytes = 0;
  for (const auto* side : {&keys_, &values_}) {
    for (const at::Tensor& t : *side) {
      if (t.defined()) bytes += t.size(1) * t.size(2) * blockTokens_ * static_cast<int64_t>(t.element_size());
    }
  }
  std::lock_guard<std::mutex> g(mutex_);
  bytesPerBlock_ = std::max(bytesPerBlock_, bytes);
  reserved_ = std::max(reserved_, want);
  return s;
}

at::Tensor& KvPool::keys(size_t layer, int64_t kvHeads, int64_t headDim, const at::TensorOptions& options) {
  return storage(keys_, layer, kvHeads, headDim, options);
}

at::Tensor& KvPool::values(size_t layer, int64_t kvHeads, int64_t headDim, const at::TensorOptions& options) {
  return storage(values_, layer, kvHeads, headDim, options);
}

const at::Tensor& KvPool::keys(size_t layer) const {
  static const at::Tensor none;
  return layer < keys_.size() ? keys_[layer] : none;
}

KvCache::KvCache(KvCache&& o) noexcept
    : pool(std::move(o.pool)), blocks(std::move(o.blocks)), length(o.length) {
  o.blocks.clear();
  o.length = 0;
}

KvCache& KvCache::operator=(KvCache&& o) noexcept {
  if (this != &o) {
    clear();
    pool = std::move(o.pool);
    blocks = std::move(o.blocks);
    length = o.length;
    o.blocks.clear();
    o.length = 0;
  }
  return *this;
}

void KvCache::clear() {
  if (pool != nullptr) pool->release(blocks);
  blocks.clear();
  length = 0;
}

}  // namespace cohort::models
