// Token shards as a Dataset of windows (docs/token-format.md).
//
// The shards, in dataset.json's order, are one stream of N tokens. Sample i
// is the window of `window` = block_size + 1 tokens starting at
// i * block_size + offset: consecutive windows share one token, so the
// windows tile the text and each token is a target at most once per epoch.
// Evaluation: offset 0 and (N - window) / block_size + 1 windows.
// Training: one window fewer when the text leaves less than block_size - 1
// tokens after the last, so that every offset in [0, block_size) fits; the
// offset is drawn from the seed the loader passes, the same for every window
// of an epoch (training seed, epoch): epochs see different cuts of the text,
// and a resumed epoch sees the same ones.
//
// A shard is mapped into memory on first use: a local file directly (its
// checksum checked once), a blob shard once the node cache holds it
// (downloaded and checked there). Encrypted shards, and blob shards without
// the cache, are read whole into memory instead.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "cohort/data/shard_source.h"
#include "cohort/data/tokens.h"
#include "data/detail/random.h"

namespace cohort::data {
namespace {

// A shard's bytes in memory: a read-only mapping or an owned copy.
class ShardBytes {
 public:
  static std::unique_ptr<ShardBytes> map(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      ::close(fd);
      throw DataError(fmt::format("{}: empty or unreadable token shard", path));
    }
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw DataError(fmt::format("{}: mmap failed: {}", path, std::strerror(errno)));
    auto b = std::make_unique<ShardBytes>();
    b->data_ = static_cast<const unsigned char*>(p);
    b->size_ = static_cast<size_t>(st.st_size);
    b->mapped_ = true;
    return b;
  }
  static std::unique_ptr<ShardBytes> own(std::string bytes) {
    auto b = std::make_unique<ShardBytes>();
    b->owned_ = std::move(bytes);
    b->data_ = reinterpret_cast<const unsigned char*>(b->owned_.data());
    b->size_ = b->owned_.size();
    return b;
  }
  ShardBytes() = default;
  ~ShardBytes() {
    if (mapped_) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  ShardBytes(const ShardBytes&) = delete;
  ShardBytes& operator=(const ShardBytes&) = delete;
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::string owned_;
};

uint32_t le32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

}  // namespace

void checkTokenShard(const unsigned char* data, size_t size, const ShardInfo& info, int64_t vocabSize,
                     const std::string& where, int width) {
  if (size != static_cast<size_t>(kTokenShardHeaderBytes + width * info.records) ||
      std::memcmp(data, kTokenShardMagic, 8) != 0) {
    throw DataError(fmt::format("{}: not a token shard of {} tokens of {} bytes ({} bytes)", where, info.records,
                                width, size));
  }
  const uint32_t version = width == 2 ? kTokenShardVersion : kTokenShardVersionWide;
  if (le32(data + 8) != version) {
    throw DataError(fmt::format("{}: token shard version {}; tokens of {} bytes (dataset.json's token_bytes) "
                                "are version {}",
                                where, le32(data + 8), width, version));
  }
  if (vocabSize <= 0) return;
  const unsigned char* p = data + kTokenShardHeaderBytes;
  for (int64_t k = 0; k < info.records; ++k) {
    const int64_t token = tokenAt(p, width, k);
    if (token >= vocabSize) {
      throw DataError(fmt::format("{}: token {} at position {} is not below vocab_size {}", where,
                                  token, k, vocabSize));
    }
  }
}

namespace {

class TokenDataset : public Dataset {
 public:
  TokenDataset(const DatasetConfig& config, const OpenOptions& options, std::unique_ptr<ShardSource> source)
      : config_(config),
        source_(std::move(source)),
        training_(options.training),
        window_(options.tokenWindow) {
    const DatasetManifest& m = source_->manifest();
    if (m.encoding != "tokens") {
      throw DataError(fmt::format("{}: encoding '{}', not a token dataset (kind: tokens reads what "
                                  "`cohort data tokenize` writes)",
                                  source_->describe(), m.encoding));
    }
    if (window_ < 2) {
      throw ConfigError(fmt::format("model.block_size: a token window needs at least 2 tokens, got {}",
                                    window_));
    }
    // The tokens are only what their tokenizer made of the text: a model
    // file other than the one recorded is refused here, not at generation.
    if (!m.tokenizerModel.empty() || m.tokenizer == kByteTokenizer) tokenizer_ = datasetTokenizer(*source_);
    first_.push_back(0);
    for (const auto& s : m.shards) first_.push_back(first_.back() + s.records);
    const int64_t tokens = first_.back();
    stride_ = window_ - 1;
    if (tokens < window_) {
      throw DataError(fmt::format("{}: {} tokens, fewer than one window of model.block_size + 1 = {}",
                                  source_->describe(), tokens, window_));
    }
    size_ = (tokens - window_) / stride_ + 1;
    slack_ = 0;
    if (training_) {
      // Room for every offset below the stride, unless the text is too short
      // for even one such window.
      if (tokens - window_ >= stride_ - 1) size_ = (tokens - window_ - (stride_ - 1)) / stride_ + 1;
      slack_ = std::min(stride_ - 1, tokens - window_ - (size_ - 1) * stride_);
    }
    if (config.limit > 0) size_ = std::min(size_, config.limit);
    shards_.resize(m.shards.size());
    once_ = std::make_unique<std::once_flag[]>(m.shards.size());
  }

  int64_t size() const override { return size_; }
  SampleShape shape() const override { return {1, 1, window_}; }
  SampleKind kind() const override { return SampleKind::tokens; }
  int64_t vocabSize() const override { return source_->manifest().vocabSize; }
  int64_t tokenId(const std::string& token) const override { return tokenizer_ ? tokenizer_->tokenId(token) : -1; }
  double bytesPerToken() const override {
    const DatasetManifest& m = source_->manifest();
    if (m.textBytes > 0 && first_.back() > 0) return double(m.textBytes) / double(first_.back());
    return m.tokenizer == kByteTokenizer ? 1.0 : 0.0;  // a dataset from before text_bytes was recorded
  }

  int64_t read(int64_t, float*, uint64_t) const override {
    throw std::logic_error(fmt::format("read of an image from a token dataset: {}", describe()));
  }

  void readTokens(int64_t index, int64_t* out, uint64_t seed) const override {
    int64_t pos = index * stride_;
    if (training_ && slack_ > 0) {
      pos += static_cast<int64_t>(detail::Rng(seed).below(static_cast<uint64_t>(slack_ + 1)));
    }
    const int64_t vocab = vocabSize();
    int64_t done = 0;
    while (done < window_) {
      const auto it = std::upper_bound(first_.begin(), first_.end(), pos + done);
      const size_t shard = static_cast<size_t>(it - first_.begin() - 1);
      const ShardBytes& bytes = shardBytes(shard);
      const int64_t at = pos + done - first_[shard];
      const int64_t n = std::min(window_ - done, first_[shard + 1] - (pos + done));
      const int width = source_->manifest().tokenBytes;
      const unsigned char* p = bytes.data() + kTokenShardHeaderBytes + width * at;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t token = tokenAt(p, width, k);
        if (token >= vocab) {
          throw DataError(fmt::format("{}/{}: token {} at position {} is not below vocab_size {}",
                                      source_->describe(), source_->manifest().shards[shard].name,
                                      token, at + k, vocab));
        }
        out[done + k] = token;
      }
      done += n;
    }
  }

  std::string describe() const override {
    const DatasetManifest& m = source_->manifest();
    return fmt::format("tokens {} ({} tokens in {} shards, tokenizer {}, vocab {}; {} windows of {})",
                       source_->describe(), first_.back(), m.shards.size(), m.tokenizer,
                       m.vocabSize, size_, window_);
  }

  std::string ioSummary() const override {
    if (!source_->remote()) return {};
    const ShardSourceStats st = source_->stats();
    return fmt::format("blob: {} shards downloaded ({:.1f} MB), {:.1f} MB read remotely",
                       st.shardsDownloaded, st.downloadedBytes / 1e6, st.remoteBytes / 1e6);
  }

 private:
  const ShardBytes& shardBytes(size_t shard) const {
    std::call_once(once_[shard], [&] { shards_[shard] = load(shard); });
    return *shards_[shard];
  }

  std::unique_ptr<ShardBytes> load(size_t shard) const {
    const DatasetManifest& m = source_->manifest();
    const ShardInfo& info = m.shards[shard];
    const std::string where = source_->describe() + "/" + info.name;
    std::unique_ptr<ShardBytes> b;
    if (!m.encryptionKeyId.empty()) {
      b = ShardBytes::own(source_->read(static_cast<int>(shard), 0, source_->shardBytes(static_cast<int>(shard))));
    } else if (!source_->remote()) {
      b = ShardBytes::map(config_.path + "/" + info.name);
      const std::string sum = checksumHex(checksum(b->data(), b->size()));
      if (static_cast<int64_t>(b->size()) != info.bytes || sum != info.checksum) {
        throw DataError(fmt::format("{}: {} bytes with checksum {}, dataset.json says {} bytes, {} "
                                    "(corrupt or replaced shard)",
                                    where, b->size(), sum, info.bytes, info.checksum));
      }
    } else {
      b = fromCache(static_cast<int>(shard));
    }
    checkTokenShard(b->data(), b->size(), info, 0, where, source_->manifest().tokenBytes);
    return b;
  }

  // A blob shard: downloaded into the node cache (checked against its
  // checksum there) and mapped, or read whole when the cache is off.
  std::unique_ptr<ShardBytes> fromCache(int shard) const {
    std::lock_guard<std::mutex> g(fetchMutex_);
    if (!source_->cacheDir().empty()) {
      source_->plan({shard});
      source_->waitForPlan();
      const std::string path =
          source_->cacheDir() + "/" + source_->manifest().shards[static_cast<size_t>(shard)].name;
      if (::access(path.c_str(), R_OK) == 0) return ShardBytes::map(path);
    }
    return ShardBytes::own(source_->read(shard, 0, source_->shardBytes(shard)));
  }

  DatasetConfig config_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<ShardSource> source_;  // not null
  bool training_;
  int64_t window_;
  int64_t stride_ = 0;
  int64_t size_ = 0;
  int64_t slack_ = 0;
  std::vector<int64_t> first_;  // first token of each shard; last: the total
  mutable std::vector<std::unique_ptr<ShardBytes>> shards_;
  std::unique_ptr<std::once_flag[]> once_;
  mutable std::mutex fetchMutex_;
};

}  // namespace

std::shared_ptr<Dataset> openTokens(const DatasetConfig& config, const OpenOptions& options) {
  return openTokens(config, options, std::make_unique<ShardSource>(config.path, options.storage, options.cache));
}

std::shared_ptr<Dataset> openTokens(const DatasetConfig& config, const OpenOptions& options,
                                    std::unique_ptr<ShardSource> source) {
  return std::make_shared<TokenDataset>(config, options, std::move(source));
}

}  // namespace cohort::data
