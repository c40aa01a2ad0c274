#include "cohort/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "cohort/core/error.h"
#include "data/detail/random.h"

namespace cohort::data {

std::vector<int64_t> permutation(int64_t size, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(size));
  std::iota(p.begin(), p.end(), int64_t{0});
  detail::Rng rng(detail::mix(seed, 0x5a3b1e, static_cast<uint64_t>(epoch)));
  for (int64_t i = size - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(p[i], p[j]);
  }
  return p;
}

std::vector<int64_t> shuffledShardOrder(const std::vector<int64_t>& counts, int64_t window,
                                        uint64_t seed, int64_t epoch) {
  COHORT_ASSERT(window >= 1, "window ", window);
  std::vector<int64_t> first(counts.size() + 1, 0);
  for (size_t s = 0; s < counts.size(); ++s) first[s + 1] = first[s] + counts[s];
  const std::vector<int64_t> shards =
      permutation(static_cast<int64_t>(counts.size()), detail::mix(seed, 0x5aad), epoch);
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(first.back()));
  for (size_t g = 0; g < shards.size(); g += static_cast<size_t>(window)) {
    const size_t begin = order.size();
    for (size_t k = g; k < std::min(shards.size(), g + static_cast<size_t>(window)); ++k) {
      const auto s = static_cast<size_t>(shards[k]);
      for (int64_t i = first[s]; i < first[s + 1]; ++i) order.push_back(i);
    }
    detail::Rng rng(detail::mix(seed, static_cast<uint64_t>(epoch), 0x9c0u + g));
    for (size_t i = order.size() - begin; i > 1; --i) {
      const size_t j = static_cast<size_t>(rng.below(i));
      std::swap(order[begin + i - 1], order[begin + j]);
    }
  }
  return order;
}

DistributedSampler::DistributedSampler(SamplerOptions options) : options_(options) {
  COHORT_ASSERT(options_.worldSize >= 1 && options_.rank >= 0 && options_.rank < options_.worldSize,
                "rank ", options_.rank, " of ", options_.worldSize);
  COHORT_ASSERT(options_.size >= 0, "size ", options_.size);
}

int64_t DistributedSampler::samplesPerRank(int64_t from) const {
  const int64_t n = options_.size;
  const int64_t w = options_.worldSize;
  COHORT_ASSERT(from == 0 || options_.evenSplit, "an uneven split starts at 0, not ", from);
  if (options_.evenSplit && options_.exactTail) {
    const int64_t left = std::max<int64_t>(0, n - from);
    return left / w + (options_.rank < left % w ? 1 : 0);
  }
  if (options_.evenSplit) return std::max<int64_t>(0, n / w * w - from) / w;
  return n / w + (options_.rank < n % w ? 1 : 0);
}

int64_t DistributedSampler::sharedSamplesPerRank(int64_t from) const {
  if (options_.evenSplit && options_.exactTail) {
    return std::max<int64_t>(0, options_.size - from) / options_.worldSize;
  }
  return options_.evenSplit ? samplesPerRank(from) : options_.size / options_.worldSize;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch, int64_t from) const {
  std::vector<int64_t> order;
  if (options_.shuffle && options_.order) {
    order = options_.order(epoch);
    COHORT_ASSERT(static_cast<int64_t>(order.size()) == options_.size, "order of ", order.size(),
                  " samples for a dataset of ", options_.size);
  } else if (options_.shuffle) {
    order = permutation(options_.size, options_.seed, epoch);
  } else {
    order.resize(static_cast<size_t>(options_.size));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const int64_t count = samplesPerRank(from);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    mine.push_back(order[static_cast<size_t>(from + options_.rank + k * options_.worldSize)]);
  }
  return mine;
}

}  // namespace cohort::data
