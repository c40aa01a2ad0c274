#pragma once

// Which samples each rank visits, in which order.

#include <cstdint>
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
};

// Each epoch, every rank computes the same permutation of [0, size) from
// (seed, epoch) and takes positions rank, rank + N, rank + 2N, ... (N ranks).
// The slices are disjoint, and the samples of step k on all ranks together
// are exactly the samples a single process with an N-times larger batch
// visits at step k: the property the DDP equivalence rests on.
class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerOptions options);
  std::vector<int64_t> indices(int64_t epoch) const;
  int64_t samplesPerRank() const;

 private:
  SamplerOptions options_;
};

// The permutation of [0, size) for (seed, epoch): Fisher-Yates on cohort's own
// generator, identical on every platform.
std::vector<int64_t> permutation(int64_t size, uint64_t seed, int64_t epoch);

}  // namespace cohort::data
