// Packed shards as a Dataset: sample i is the i-th record counting through
// the shards in dataset.json's order. Each shard's index is read once, on
// first use; each record is read with one read of exactly its bytes.

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/data/dataset.h"
#include "cohort/data/image.h"
#include "cohort/data/sampler.h"
#include "cohort/data/shard.h"
#include "cohort/data/shard_source.h"
#include "data/detail/random.h"

namespace cohort::data {
namespace {

class ShardDataset : public Dataset {
 public:
  ShardDataset(const DatasetConfig& config, int64_t numClasses, const OpenOptions& options)
      : config_(config), source_(config.path, options.storage, options.cache) {
    const DatasetManifest& m = source_.manifest();
    first_.push_back(0);
    for (const auto& s : m.shards) {
      counts_.push_back(s.records);
      first_.push_back(first_.back() + s.records);
    }
    size_ = first_.back();
    if (config.limit > 0) size_ = std::min(size_, config.limit);
    if (size_ == 0) throw DataError(fmt::format("{}: the dataset holds no records", source_.describe()));
    if (static_cast<int64_t>(m.classes.size()) > numClasses) {
      throw DataError(fmt::format("{}: the dataset has {} classes but model.num_classes is {}",
                                  source_.describe(), m.classes.size(), numClasses));
    }
    numClasses_ = numClasses;
    indexes_.resize(m.shards.size());
    indexOnce_ = std::make_unique<std::once_flag[]>(m.shards.size());
    if (m.encoding == "raw") {
      shape_ = {m.rawShape[0], m.rawShape[1], m.rawShape[2]};
    } else {
      transform_.outHeight = config.cropSize;
      transform_.outWidth = config.cropSize;
      transform_.channels = 3;
      transform_.randomResizedCrop = options.training && config.augment.randomResizedCrop;
      if (config.augment.scale.size() == 2) {
        transform_.scaleMin = config.augment.scale[0];
        transform_.scaleMax = config.augment.scale[1];
      }
      if (config.augment.ratio.size() == 2) {
        transform_.ratioMin = config.augment.ratio[0];
        transform_.ratioMax = config.augment.ratio[1];
      }
      transform_.resizeShorter = config.resizeSize > 0
                                     ? config.resizeSize
                                     : static_cast<int64_t>(std::lround(config.cropSize / 0.875));
      shape_ = {3, config.cropSize, config.cropSize};
    }
  }

  int64_t size() const override { return size_; }
  SampleShape shape() const override { return shape_; }

  std::string describe() const override {
    const DatasetManifest& m = source_.manifest();
    return fmt::format("shards {} ({} of {} records in {} shards, {} classes, {} x {}x{}x{})",
                       source_.describe(), size_, m.records(), m.shards.size(), m.classes.size(),
                       m.encoding == "raw" ? "raw" : "images", shape_.channels, shape_.height,
                       shape_.width);
  }

  std::vector<int64_t> shuffledOrder(uint64_t seed, int64_t epoch) const override {
    std::vector<int64_t> order = shuffledShardOrder(counts_, config_.shuffleWindow, seed, epoch);
    if (size_ < first_.back()) {  // data.*.limit: the first `limit` records only
      order.erase(std::remove_if(order.begin(), order.end(), [&](int64_t i) { return i >= size_; }),
                  order.end());
    }
    return order;
  }

  void willRead(const std::vector<int64_t>& indices) const override {
    std::vector<int> plan;
    std::vector<bool> seen(counts_.size(), false);
    for (int64_t i : indices) {
      const int s = shardOf(i);
      if (!seen[static_cast<size_t>(s)]) {
        seen[static_cast<size_t>(s)] = true;
        plan.push_back(s);
      }
    }
    source_.plan(std::move(plan));
  }

  std::string ioSummary() const override {
    if (!source_.remote()) return {};
    const ShardSourceStats s = source_.stats();
    return fmt::format("{}: {:.1f} MB in {} ranged reads from blob storage; {} shards ({:.1f} MB) "
                       "downloaded into the cache by this process; {:.1f} MB read from local disk",
                       source_.describe(), double(s.remoteBytes) / 1e6, s.remoteReads,
                       s.shardsDownloaded, double(s.downloadedBytes) / 1e6,
                       double(s.localBytes) / 1e6);
  }

  int64_t read(int64_t index, float* out, uint64_t seed) const override {
    COHORT_ASSERT(index >= 0 && index < size_, "sample ", index, " of ", size_);
    const int shard = shardOf(index);
    const ShardIndex& shardIndex = indexOf(shard);
    const auto r = static_cast<size_t>(index - first_[static_cast<size_t>(shard)]);
    const std::string& name = source_.manifest().shards[static_cast<size_t>(shard)].name;
    const std::string where = source_.describe() + "/" + name;
    const int64_t at = shardIndex.begin(r);
    const Record rec = parseRecord(source_.read(shard, at, shardIndex.end(r) - at), at, where);
    if (rec.label < 0 || rec.label >= numClasses_) {
      throw DataError(fmt::format("{}: record '{}' at offset {} has label {}, outside [0, {})", where,
                                  rec.key, at, rec.label, numClasses_));
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(rec.payload.data());
    if (source_.manifest().encoding == "raw") {
      const auto n = static_cast<size_t>(shape_.numel());
      if (rec.payload.size() != n) {
        throw DataError(fmt::format("{}: record '{}' holds {} bytes, {}x{}x{} pixels are {}", where,
                                    rec.key, rec.payload.size(), shape_.channels, shape_.height,
                                    shape_.width, n));
      }
      for (size_t k = 0; k < n; ++k) out[k] = static_cast<float>(bytes[k]) * (1.0f / 255.0f);
      return rec.label;
    }
    try {
      decodeImage(bytes, rec.payload.size(), transform_, detail::mix(seed, 0xdec0de), out);
    } catch (const DataError& e) {
      if (config_.onCorrupt == OnCorrupt::fail) {
        throw DataError(fmt::format("{}: image '{}' at offset {} does not decode: {} "
                                    "(on_corrupt: skip would skip it)",
                                    where, rec.key, at, e.what()));
      }
      log::warn("skipping image '{}' of {} (offset {}): {}", rec.key, where, at, e.what());
      return kSkippedSample;
    }
    return rec.label;
  }

 private:
  int shardOf(int64_t index) const {
    auto it = std::upper_bound(first_.begin(), first_.end(), index);
    return static_cast<int>(it - first_.begin()) - 1;
  }

  const ShardIndex& indexOf(int shard) const {
    const auto s = static_cast<size_t>(shard);
    std::call_once(indexOnce_[s], [&] {
      const ShardInfo& info = source_.manifest().shards[s];
      const std::string where = source_.describe() + "/" + info.name;
      ShardIndex index = readShardIndex(
          [&](int64_t offset, int64_t length) { return source_.read(shard, offset, length); },
          source_.shardBytes(shard), where);
      if (static_cast<int64_t>(index.size()) != info.records) {
        throw DataError(fmt::format("{}: holds {} records, dataset.json says {}", where,
                                    index.size(), info.records));
      }
      indexes_[s] = std::move(index);
    });
    return indexes_[s];
  }

  DatasetConfig config_;
  mutable ShardSource source_;
  std::vector<int64_t> counts_;
  std::vector<int64_t> first_;
  int64_t size_ = 0;
  int64_t numClasses_ = 0;
  SampleShape shape_;
  ImageTransform transform_;
  // Written once per shard under its once_flag, read-only afterwards.
  std::unique_ptr<std::once_flag[]> indexOnce_;
  mutable std::vector<ShardIndex> indexes_;
};

}  // namespace

std::shared_ptr<Dataset> openShards(const DatasetConfig& config, int64_t numClasses,
                                    const OpenOptions& options) {
  if (config.path.empty()) throw DataError("kind shards needs `path`: a packed dataset directory or URL");
  return std::make_shared<ShardDataset>(config, numClasses, options);
}

}  // namespace cohort::data
