#include "cohort/data/shard_source.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/security/keys.h"
#include "cohort/security/sealed.h"
#include "cohort/core/log.h"

namespace cohort::data {

namespace fs = std::filesystem;

// An open file; closed when the last reader lets go of it, so eviction can
// drop a shard while another thread is still reading from it.
struct ShardSource::OpenFile {
  int fd = -1;
  explicit OpenFile(int f) : fd(f) {}
  ~OpenFile() { ::close(fd); }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
};

struct ShardSource::Shard {
  std::mutex mutex;
  std::shared_ptr<OpenFile> file;  // local file (dataset directory or cache), once known
  bool cached = false;             // the cache holds it (blob datasets)
  size_t planPosition = 0;         // where the current plan reads it
  std::shared_ptr<const security::SealedReader> sealed;  // encrypted datasets, once opened
};

namespace {

std::string readLocalFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw DataError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string preadExact(int fd, int64_t offset, int64_t length, const std::string& what) {
  std::string out(static_cast<size_t>(length), '\0');
  int64_t done = 0;
  while (done < length) {
    ssize_t n = ::pread(fd, out.data() + done, static_cast<size_t>(length - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw DataError(fmt::format("{}: read at offset {} failed: {}", what, offset + done,
                                           std::strerror(errno)));
    if (n == 0) {
      throw DataError(fmt::format("{}: truncated: wanted {} bytes at offset {}, the file ends at {}",
                                  what, length, offset, offset + done));
    }
    done += n;
  }
  return out;
}

}  // namespace

std::string ShardSource::readFile(const std::string& name) const {
  if (!storage_) {
    const std::string path = localRoot_ + "/" + name;
    if (!fs::exists(path)) throw DataError(fmt::format("{}: missing (dataset.json names it)", path));
    return readLocalFile(path);
  }
  try {
    return storage_->readRange(name, 0, storage_->size(name));
  } catch (const storage::StorageError& e) {
    if (e.notFound()) throw DataError(fmt::format("{}/{}: missing (dataset.json names it)", describe_, name));
    throw;
  }
}

ShardSource::ShardSource(const std::string& url, const storage::StorageOptions& storageOptions,
                         const CacheConfig& cache)
    : url_(url), storageOptions_(storageOptions), cache_(cache) {
  std::string manifestText;
  std::string manifestWhere;
  if (storage::isRemoteUrl(url)) {
    storage_ = storage::openStorage(url, storageOptions_);
    describe_ = storage_->describe();
    manifestWhere = describe_ + "/" + kDatasetManifestName;
    try {
      manifestText = storage_->readRange(kDatasetManifestName, 0, storage_->size(kDatasetManifestName));
    } catch (const storage::StorageError& e) {
      if (e.notFound()) {
        throw DataError(fmt::format("{}: no packed dataset here (dataset.json is missing; "
                                    "make one with `cohort data pack`)", describe_));
      }
      throw;
    }
  } else {
    localRoot_ = url.rfind("file://", 0) == 0 ? url.substr(7) : url;
    describe_ = localRoot_;
    manifestWhere = localRoot_ + "/" + kDatasetManifestName;
    if (!fs::exists(manifestWhere)) {
      throw DataError(fmt::format("{}: no packed dataset here ({} is missing; make one with "
                                  "`cohort data pack`)", localRoot_, kDatasetManifestName));
    }
    manifestText = readLocalFile(manifestWhere);
  }
  manifest_ = parseDatasetManifest(manifestText, manifestWhere);
  for (size_t i = 0; i < manifest_.shards.size(); ++i) shards_.push_back(std::make_unique<Shard>());

  if (storage_ && cache_.enabled) {
    // One directory per dataset version: the manifest's hash changes when the
    // dataset is packed again, so stale shards are never read.
    Hasher h;
    h.update(describe_.data(), describe_.size());
    h.update(manifestText.data(), manifestText.size());
    cacheDir_ = (fs::path(cache_.dir) / h.hex()).string();
    std::error_code ec;
    fs::create_directories(cacheDir_, ec);
    if (ec) {
      log::warn("data cache {}: cannot create it ({}); reading {} from blob storage without a cache",
                cacheDir_, ec.message(), describe_);
      cacheDir_.clear();
    } else {
      fetcher_ = std::thread([this] { fetchLoop(); });
    }
  }
}

ShardSource::~ShardSource() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (fetcher_.joinable()) fetcher_.join();
}

std::shared_ptr<ShardSource::OpenFile> ShardSource::openFile(int shard) {
  Shard& s = *shards_[static_cast<size_t>(shard)];
  std::lock_guard<std::mutex> g(s.mutex);
  if (s.file) return s.file;
  const ShardInfo& info = manifest_.shards[static_cast<size_t>(shard)];
  if (!storage_) {
    const std::string path = localRoot_ + "/" + info.name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw DataError(fmt::format("{}: cannot open shard: {}", path, std::strerror(errno)));
    auto file = std::make_shared<OpenFile>(fd);
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size != info.bytes) {
      throw DataError(fmt::format("{}: {} bytes, dataset.json says {} (truncated or replaced shard)",
                                  path, st.st_size, info.bytes));
    }
    s.file = std::move(file);
    return s.file;
  }
  if (cacheDir_.empty()) return nullptr;
  // Only complete, verified shards carry their own name in the cache.
  const int fd = ::open((cacheDir_ + "/" + info.name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  ::futimens(fd, nullptr);  // recently used: evicted last
  s.file = std::make_shared<OpenFile>(fd);
  s.cached = true;
  return s.file;
}

std::shared_ptr<const security::SealedReader> ShardSource::sealed(int shard) {
  Shard& s = *shards_[static_cast<size_t>(shard)];
  {
    std::lock_guard<std::mutex> g(s.mutex);
    if (s.sealed) return s.sealed;
  }
  // Opening reads the header through readRaw, which takes the shard's lock.
  const ShardInfo& info = manifest_.shards[static_cast<size_t>(shard)];
  auto reader = std::make_shared<const security::SealedReader>(
      [this, shard](uint64_t o, uint64_t n) {
        return readRaw(shard, static_cast<int64_t>(o), static_cast<int64_t>(n));
      },
      static_cast<uint64_t>(info.bytes), info.name, security::installedKeyring(),
      describe_ + "/" + info.name);
  std::lock_guard<std::mutex> g(s.mutex);
  if (!s.sealed) s.sealed = std::move(reader);
  return s.sealed;
}

int64_t ShardSource::shardBytes(int shard) {
  COHORT_ASSERT(shard >= 0 && static_cast<size_t>(shard) < shards_.size(), "shard ", shard);
  if (manifest_.encryptionKeyId.empty()) return manifest_.shards[static_cast<size_t>(shard)].bytes;
  return static_cast<int64_t>(sealed(shard)->plainBytes());
}

std::string ShardSource::read(int shard, int64_t offset, int64_t length) {
  if (manifest_.encryptionKeyId.empty()) return readRaw(shard, offset, length);
  if (offset < 0 || length < 0) {
    throw DataError(fmt::format("{}: read of {} bytes at offset {}", describe_, length, offset));
  }
  return sealed(shard)->read(static_cast<uint64_t>(offset), static_cast<uint64_t>(length));
}

std::string ShardSource::readRaw(int shard, int64_t offset, int64_t length) {
  COHORT_ASSERT(shard >= 0 && static_cast<size_t>(shard) < shards_.size(), "shard ", shard);
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (fetchError_) std::rethrow_exception(fetchError_);
    // The fetcher stays a few shards ahead of the reads.
    const size_t at = shards_[static_cast<size_t>(shard)]->planPosition;
    if (at >= readPosition_ && at < plan_.size() && plan_[at] == shard) {
      readPosition_ = at;
      cv_.notify_all();
    }
  }
  const ShardInfo& info = manifest_.shards[static_cast<size_t>(shard)];
  if (offset < 0 || length < 0 || offset + length > info.bytes) {
    throw DataError(fmt::format("{}/{}: read of {} bytes at offset {} is past its end ({} bytes)",
                                describe_, info.name, length, offset, info.bytes));
  }
  if (const auto file = openFile(shard)) {
    std::string out = preadExact(file->fd, offset, length, describe_ + "/" + info.name);
    std::lock_guard<std::mutex> g(mutex_);
    stats_.localBytes += length;
    return out;
  }
  // Not in the cache (yet): a ranged GET of just these bytes.
  std::string out = storage_->readRange(info.name, offset, length);
  std::lock_guard<std::mutex> g(mutex_);
  ++stats_.remoteReads;
  stats_.remoteBytes += length;
  return out;
}

void ShardSource::plan(std::vector<int> shards) {
  if (!fetcher_.joinable()) return;
  // Shards about to be read again count as recently used.
  for (int shard : shards) {
    const std::string path = cacheDir_ + "/" + manifest_.shards[static_cast<size_t>(shard)].name;
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  }
  {
    std::lock_guard<std::mutex> g(mutex_);
    plan_ = std::move(shards);
    planPos_ = 0;
    readPosition_ = 0;
    for (size_t i = 0; i < plan_.size(); ++i) {
      shards_[static_cast<size_t>(plan_[i])]->planPosition = i;
    }
  }
  cv_.notify_all();
}

void ShardSource::waitForPlan() {
  std::unique_lock<std::mutex> lock(mutex_);
  waitAll_ = true;
  cv_.notify_all();
  cv_.wait(lock, [&] {
    return fetchError_ || stop_ || cacheOff_ || (planPos_ >= plan_.size() && !fetching_);
  });
  waitAll_ = false;
  if (fetchError_) std::rethrow_exception(fetchError_);
}

ShardSourceStats ShardSource::stats() const {
  std::lock_guard<std::mutex> g(mutex_);
  return stats_;
}

void ShardSource::fetchLoop() {
  for (;;) {
    int shard = -1;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      fetching_ = false;
      cv_.notify_all();
      // At most kFetchAhead shards ahead of the reads: a bounded cache
      // must not evict downloaded shards before they are read.
      cv_.wait(lock, [&] {
        return stop_ || (!fetchError_ && !cacheOff_ && planPos_ < plan_.size() &&
                         (waitAll_ || planPos_ < readPosition_ + kFetchAhead));
      });
      if (stop_) return;
      shard = plan_[planPos_++];
      fetching_ = true;
    }
    try {
      fetchOne(shard);
    } catch (const IoError& e) {
      if (dynamic_cast<const storage::StorageError*>(&e) != nullptr) {
        std::lock_guard<std::mutex> g(mutex_);
        fetchError_ = std::current_exception();
        continue;
      }
      // The local disk failed (full, read-only): train on, reading every
      // record from blob storage.
      log::warn("data cache {}: {}; reading the rest from blob storage without the cache",
                cacheDir_, e.what());
      std::lock_guard<std::mutex> g(mutex_);
      cacheOff_ = true;
    } catch (...) {
      std::lock_guard<std::mutex> g(mutex_);
      fetchError_ = std::current_exception();
    }
  }
}

// Downloads one shard into the cache unless it is there or another process
// is downloading it. Returns true when this call downloaded it.
bool ShardSource::fetchOne(int shard) {
  const ShardInfo& info = manifest_.shards[static_cast<size_t>(shard)];
  const std::string path = cacheDir_ + "/" + info.name;
  if (fs::exists(path)) return false;
  const std::string lockPath = path + ".lock";
  int lockFd = ::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lockFd < 0) {
    throw IoError(fmt::format("{}: cannot create: {}", lockPath, std::strerror(errno)));
  }
  struct LockGuard {
    int fd;
    ~LockGuard() { ::close(fd); }  // closing releases the flock
  } guard{lockFd};
  if (::flock(lockFd, LOCK_EX | LOCK_NB) != 0) return false;  // another rank of this node has it
  if (fs::exists(path)) return false;                         // it finished meanwhile

  const std::string part = fmt::format("{}.part-{}", path, ::getpid());
  try {
    storage_->readToFile(info.name, part);
    uint64_t size = 0;
    const std::string sum = checksumFile(part, &size);
    if (static_cast<int64_t>(size) != info.bytes || sum != info.checksum) {
      throw DataError(fmt::format(
          "{}/{}: downloaded {} bytes with checksum {}, dataset.json says {} bytes, {} "
          "(the shard changed since it was packed, or the transfer was corrupted)",
          describe_, info.name, size, sum, info.bytes, info.checksum));
    }
    fs::rename(part, path);
  } catch (...) {
    std::error_code ec;
    fs::remove(part, ec);
    throw;
  }
  {
    std::lock_guard<std::mutex> g(mutex_);
    ++stats_.shardsDownloaded;
    stats_.downloadedBytes += info.bytes;
  }
  log::debug("data cache: {} downloaded to {}", info.name, cacheDir_);
  if (cache_.maxGb > 0) evict(path);
  return true;
}

// Deletes the least recently used complete shards of the whole cache (every
// dataset under cache.dir) until it fits max_gb. Readers that have a shard
// open keep reading it: the file lives until they close it.
void ShardSource::evict(const std::string& keep) {
  struct Entry {
    fs::path path;
    int64_t bytes;
    fs::file_time_type used;
  };
  std::vector<Entry> entries;
  int64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(cache_.dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    // Another rank may delete files meanwhile: skip what vanished.
    std::error_code entryError;
    if (!it->is_regular_file(entryError) || entryError) continue;
    const std::string name = it->path().filename().string();
    if (name.find(".part-") != std::string::npos || name.size() < 5 ||
        name.compare(name.size() - 5, 5, ".lock") == 0) {
      continue;
    }
    const auto bytes = it->file_size(entryError);
    const auto used = it->last_write_time(entryError);
    if (entryError) continue;
    total += static_cast<int64_t>(bytes);
    entries.push_back({it->path(), static_cast<int64_t>(bytes), used});
  }
  const auto limit = static_cast<int64_t>(cache_.maxGb * 1e9);
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
  for (const auto& e : entries) {
    if (total <= limit) break;
    if (e.path == fs::path(keep)) continue;
    if (fs::remove(e.path, ec)) {
      total -= e.bytes;
      log::info("data cache: evicted {} ({} MB) to stay under {} GB", e.path.string(),
                e.bytes / 1000000, cache_.maxGb);
    }
  }
  // Shards evicted here are read remotely from now on: forget their cached state.
  for (size_t i = 0; i < shards_.size(); ++i) {
    Shard& s = *shards_[i];
    std::lock_guard<std::mutex> g(s.mutex);
    if (s.cached && !fs::exists(cacheDir_ + "/" + manifest_.shards[i].name)) {
      s.file.reset();  // closed once the reads in flight are done
      s.cached = false;
    }
  }
}

}  // namespace cohort::data
