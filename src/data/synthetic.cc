#include <fmt/format.h>

#include <algorithm>

#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "data/detail/random.h"

namespace cohort::data {
namespace {

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t size, SampleShape shape, int64_t numClasses, uint64_t seed)
      : size_(size), shape_(shape), numClasses_(numClasses), seed_(seed) {}

  int64_t size() const override { return size_; }
  SampleShape shape() const override { return shape_; }

  int64_t read(int64_t index, float* out, uint64_t /*seed*/) const override {
    const int64_t label = static_cast<int64_t>(
        detail::mix(seed_, 0x5eed, static_cast<uint64_t>(index)) % uint64_t(numClasses_));
    // Pixels: 0.5 +- 0.2 following a pattern of the class (constant over
    // 8-pixel runs, the same for every seed, so a training set and an
    // evaluation set with different seeds share it), plus uniform noise.
    detail::Rng noise(detail::mix(seed_, 0x9015e, static_cast<uint64_t>(index)));
    const uint64_t classKey = detail::mix(0xc1a55, static_cast<uint64_t>(label));
    const int64_t n = shape_.numel();
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t bit = detail::mix(classKey, static_cast<uint64_t>(i >> 3)) & 1u;
      const float v = 0.5f + (bit ? 0.2f : -0.2f) + 0.4f * (noise.uniform() - 0.5f);
      out[i] = std::clamp(v, 0.0f, 1.0f);
    }
    return label;
  }

  std::string describe() const override {
    return fmt::format("synthetic ({} x {}x{}x{}, {} classes, seed {})", size_, shape_.channels,
                       shape_.height, shape_.width, numClasses_, seed_);
  }

 private:
  int64_t size_;
  SampleShape shape_;
  int64_t numClasses_;
  uint64_t seed_;
};

}  // namespace

std::shared_ptr<Dataset> makeSynthetic(int64_t size, SampleShape shape, int64_t numClasses,
                                       uint64_t seed) {
  COHORT_ASSERT(size > 0 && shape.numel() > 0 && numClasses > 0, "bad synthetic dataset");
  return std::make_shared<SyntheticDataset>(size, shape, numClasses, seed);
}

}  // namespace cohort::data
