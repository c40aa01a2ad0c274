#pragma once

// Which samples each rank visits, in which order.

#include <cstdint>
#include <functional>
#include <vector>

namespace cohort::data {

struct SamplerOptions {
  int64_t size = 0;      // samples in the dataset
  int worldSize = 1;
  int rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  // true (training): every rank gets exactly floor(size / worldSize) samples;
  // the tail of the permutation that does not fill a round is left out this epoch.
  // false (evaluation): every sample is visited once by exactly one rank.
  bool evenSplit = true;
  // The shuffled order of an epoch (Dataset::shuffledOrder); empty: permutation().
  std::function<std::vector<int64_t>(int64_t epoch)> order;
  // With evenSplit (elastic jobs, docs/elastic.md): the positions left after
  // the last full round (fewer than N) go one each to ranks 0, 1, ..., so
  // every sample of the epoch is visited once, whatever the world size and
  // wherever the epoch was taken up. Ranks' counts then differ by at most
  // one: plan with sharedSamplesPerRank(), and let the loader fold a lone
  // last sample into the batch before it (LoaderOptions::absorbTail).
  bool exactTail = false;
};

// Each epoch, every rank computes the same permutation of [0, size) from
// (seed, epoch) (or `order`'s) and takes positions rank, rank + N, rank + 2N,
// ... (N ranks).
// The slices are disjoint, and the samples of step k on all ranks together
// are exactly the samples a single process with an N-times larger batch
// visits at step k: the property the DDP equivalence rests on.
//
// An epoch can also be taken up at position `from` of its order (a resume
// on another world size: the positions before it were consumed by the
// ranks of the run that wrote the checkpoint): rank r then takes from + r,
// from + r + N, ... and every rank the same count, the positions left
// before the epoch's even end (floor(size / N) N) divided by N. With
// `from` a multiple of N this is the tail of the list from 0.
class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerOptions options);
  std::vector<int64_t> indices(int64_t epoch, int64_t from = 0) const;
  // This rank's count.
  int64_t samplesPerRank(int64_t from = 0) const;
  // The count every rank has (the least of them): what steps are planned by.
  int64_t sharedSamplesPerRank(int64_t from = 0) const;

 private:
  SamplerOptions options_;
};

// The permutation of [0, size) for (seed, epoch): Fisher-Yates on cohort's own
// generator, identical on every platform.
std::vector<int64_t> permutation(int64_t size, uint64_t seed, int64_t epoch);

// The shuffled order of a sharded dataset whose shard s holds counts[s]
// samples, numbered consecutively: the shards are permuted by (seed, epoch),
// cut into groups of `window` consecutive shards of that order, and the
// samples of each group are permuted among themselves. A reader thus needs at
// most `window` shards at a time, while the order stays well mixed.
std::vector<int64_t> shuffledShardOrder(const std::vector<int64_t>& counts, int64_t window,
                                        uint64_t seed, int64_t epoch);

}  // namespace cohort::data
