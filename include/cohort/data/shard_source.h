#pragma once

// Where a packed dataset's bytes come from: a local directory, or blob
// storage through a node-local read-through cache.
//
// Design (blob storage): a fetcher thread downloads whole shards into the
// cache in the order the epoch will read them (plan()), at most kFetchAhead
// shards ahead of the reads, each verified against
// dataset.json's checksum and renamed into place. A read of a shard that is
// not cached yet does not wait for it: it fetches just that record with a
// ranged GET. So the first epoch streams, and every later epoch reads local
// disk. The ranks of a node share the cache: a shard being downloaded by one
// process (an flock on <shard>.lock) is skipped by the others' fetchers, and
// they read it with ranged GETs until it lands. The cache is bounded
// (max_gb): after each download the least recently used shards are evicted.
// When the cache's disk fails (full, read-only), a warning is logged and the
// rest is read with ranged GETs. Storage clients are used from several threads.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cohort/config/job.h"
#include "cohort/data/dataset_manifest.h"
#include "cohort/storage/storage.h"

namespace cohort::security {
class SealedReader;
}

namespace cohort::data {

struct ShardSourceStats {
  int64_t remoteReads = 0;      // ranged GETs of records
  int64_t remoteBytes = 0;      // bytes of those reads
  int64_t shardsDownloaded = 0; // whole shards this process put in the cache
  int64_t downloadedBytes = 0;
  int64_t localBytes = 0;       // bytes read from local files (dataset dir or cache)
};

class ShardSource {
 public:
  // Opens the dataset at `url` (a directory or blob URL) and reads its
  // manifest. Throws DataError (missing or invalid manifest) or StorageError.
  ShardSource(const std::string& url, const storage::StorageOptions& storageOptions,
              const CacheConfig& cache);
  ~ShardSource();  // stops and joins the fetcher
  ShardSource(const ShardSource&) = delete;
  ShardSource& operator=(const ShardSource&) = delete;

  const DatasetManifest& manifest() const { return manifest_; }
  const std::string& describe() const { return describe_; }
  bool remote() const { return storage_ != nullptr; }
  // The cache directory of this dataset (blob storage with the cache on).
  const std::string& cacheDir() const { return cacheDir_; }

  // Reads `length` bytes at `offset` of shard `shard`'s contents: decrypted
  // and authenticated when the dataset is encrypted (with the installed
  // keyring, security/keys.h). Thread-safe. Throws DataError/StorageError
  // naming the shard (ConfigError: no key for it); rethrows a fetcher failure.
  std::string read(int shard, int64_t offset, int64_t length);
  // A small file of the dataset beside its shards (its tokenizer model),
  // whole. Throws DataError naming it when it is missing.
  std::string readFile(const std::string& name) const;
  // The size of shard `shard`'s contents (its file's size when not encrypted).
  int64_t shardBytes(int shard);
  // The bytes of the file as stored (sealed, when encrypted), as read() does.
  std::string readRaw(int shard, int64_t offset, int64_t length);

  // The shards in the order they will be read: the fetcher downloads them in
  // this order, replacing any previous plan. No-op for local datasets.
  void plan(std::vector<int> shards);
  // Lets the fetcher run through the whole current plan and blocks until it
  // has (tests and benchmarks); rethrows its failure.
  void waitForPlan();

  ShardSourceStats stats() const;

 private:
  struct Shard;
  struct OpenFile;
  static constexpr size_t kFetchAhead = 8;  // shards the fetcher may run ahead of the reads
  std::shared_ptr<OpenFile> openFile(int shard);
  std::shared_ptr<const security::SealedReader> sealed(int shard);
  void fetchLoop();
  bool fetchOne(int shard);
  void evict(const std::string& keep);

  std::string url_;
  std::string describe_;
  storage::StorageOptions storageOptions_;
  CacheConfig cache_;
  DatasetManifest manifest_;
  std::string localRoot_;  // local datasets
  std::unique_ptr<storage::Storage> storage_;  // blob: the manifest reader and fetcher
  std::string cacheDir_;
  std::vector<std::unique_ptr<Shard>> shards_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int> plan_;
  size_t planPos_ = 0;       // next plan entry the fetcher takes
  size_t readPosition_ = 0;  // plan entry of the furthest shard read so far
  bool waitAll_ = false;     // waitForPlan(): fetch the whole plan now
  bool cacheOff_ = false;    // the cache's disk failed: read remotely only
  bool stop_ = false;
  bool fetching_ = false;
  std::exception_ptr fetchError_;
  std::thread fetcher_;
  ShardSourceStats stats_;
};

}  // namespace cohort::data
