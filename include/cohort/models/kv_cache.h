#pragma once

// The keys and values a language model keeps while it generates
// (Model::decode), held in fixed-size blocks of positions: memory follows
// the positions a sequence holds, not the longest it could reach.
//
// A KvPool holds, per layer, one storage of slots [blocks x blockTokens,
// key/value heads, head_dim] for the keys and one for the values, and
// hands out block ids: block b is slots b*blockTokens .. (b+1)*blockTokens - 1
// of every layer. A KvCache is one sequence's list of blocks (its block
// table) and its length; position p lives in slot
// blocks[p / blockTokens] * blockTokens + p % blockTokens. Several caches
// share a pool (cohort serve: every running generation), or a cache makes
// a private one at its first decode (cohort generate, tests).
//
// The storage grows when blocks beyond it are handed out (by a quarter of
// its size or more, copying what it holds) and keeps its size: the pool holds its
// peak, what the caches hold follows their tokens. Freed blocks are reused
// first.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace cohort::models {

// Positions per block unless a pool is made with another size.
inline constexpr int64_t kKvBlockTokens = 16;

class KvPool {
 public:
  explicit KvPool(int64_t blockTokens = kKvBlockTokens);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  int64_t blockTokens() const { return blockTokens_; }
  // Blocks held by caches; block ids handed out so far (in use or free);
  // blocks the storage has room for (its memory: blocksReserved() x
  // bytesPerBlock(); at least blocksTotal() once decoded, at most a quarter
  // more). Thread-safe.
  int64_t blocksInUse() const;
  int64_t blocksTotal() const;
  int64_t blocksReserved() const;
  // Bytes of storage per block over every layer (keys and values), once
  // the first decode has made the storage; 0 before.
  int64_t bytesPerBlock() const;

  // `n` free block ids (reused ones first). Thread-safe.
  std::vector<int64_t> allocate(int64_t n);
  // Gives blocks back. Thread-safe (a cache may be dropped on any thread).
  void release(const std::vector<int64_t>& blocks);

  // Layer `layer`'s storage of keys or values, [slots, kvHeads, headDim],
  // made or grown so that every block handed out has its slots. Only the
  // thread that decodes calls these (one at a time); a storage made by an
  // earlier call keeps its shape and options. Slots of blocks never written
  // are zeros.
  at::Tensor& keys(size_t layer, int64_t kvHeads, int64_t headDim, const at::TensorOptions& options);
  at::Tensor& values(size_t layer, int64_t kvHeads, int64_t headDim, const at::TensorOptions& options);
  // The layer's storage as it is (undefined before its first decode).
  const at::Tensor& keys(size_t layer) const;

 private:
  at::Tensor& storage(std::vector<at::Tensor>& of, size_t layer, int64_t kvHeads, int64_t headDim,
                      const at::TensorOptions& options);

  const int64_t blockTokens_;
  mutable std::mutex mutex_;
  std::vector<int64_t> free_;  // block ids given back, reused last-freed first
  int64_t total_ = 0;          // ids 0 .. total_ - 1 handed out at some time
  int64_t inUse_ = 0;
  std::vector<at::Tensor> keys_, values_;  // per layer, the decoding thread's
  int64_t bytesPerBlock_ = 0;
  int64_t reserved_ = 0;
};

// One sequence's positions in a pool. Made empty; Model::decode fills it,
// taking blocks from its pool as positions need them (a cache without a
// pool makes its own private one, of kKvBlockTokens). Holds block_size
// positions at most. Movable, not copyable: its blocks are its own, and go
// back to the pool when it is cleared or destroyed.
struct KvCache {
  KvCache() = default;
  explicit KvCache(std::shared_ptr<KvPool> pool) : pool(std::move(pool)) {}
  ~KvCache() { clear(); }
  KvCache(KvCache&& o) noexcept;
  KvCache& operator=(KvCache&& o) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  std::shared_ptr<KvPool> pool;
  std::vector<int64_t> blocks;  // the block table: positions [i*blockTokens, (i+1)*blockTokens) in blocks[i]
  int64_t length = 0;           // positions held

  // Gives the blocks back to the pool (keeping the pool) and empties it.
  void clear();
};

}  // namespace cohort::models
