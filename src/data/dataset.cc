#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "cohort/data/sampler.h"

namespace cohort::data {

std::vector<int64_t> Dataset::shuffledOrder(uint64_t seed, int64_t epoch) const {
  return permutation(size(), seed, epoch);
}

void Dataset::readTokens(int64_t /*index*/, int64_t* /*out*/, uint64_t /*seed*/) const {
  throw std::logic_error(fmt::format("readTokens on an image dataset: {}", describe()));
}

int64_t Dataset::readText(int64_t /*index*/, int64_t* /*out*/) const {
  throw std::logic_error(fmt::format("readText on a dataset of other samples: {}", describe()));
}

std::shared_ptr<Dataset> openDataset(const DatasetConfig& config, int64_t numClasses,
                                     const OpenOptions& options) {
  switch (config.kind) {
    case DataKind::shards: return openShards(config, numClasses, options);
    case DataKind::tokens: return openTokens(config, options);
    case DataKind::textClasses: return openTextClasses(config, numClasses, options);
    case DataKind::idx: return openIdx(config.images, config.labels, config.limit, numClasses);
    case DataKind::synthetic: {
      int64_t size = config.limit > 0 ? std::min(config.limit, config.size) : config.size;
      SampleShape shape{config.shape.at(0), config.shape.at(1), config.shape.at(2)};
      return makeSynthetic(size, shape, numClasses, static_cast<uint64_t>(config.seed));
    }
    case DataKind::none: break;
  }
  throw DataError(fmt::format("no dataset: kind '{}'", choiceName(config.kind)));
}

}  // namespace cohort::data
