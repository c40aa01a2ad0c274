#include "cohort/data/transform.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "cohort/core/error.h"
#include "data/detail/random.h"

namespace cohort::data {

Transform Transform::fromConfig(const DatasetConfig& config, const SampleShape& shape,
                                bool training, const std::string& section) {
  Transform t;
  auto check = [&](const std::vector<double>& v, const char* key) {
    if (!v.empty() && v.size() != 1 && static_cast<int64_t>(v.size()) != shape.channels) {
      throw ConfigError(fmt::format("{}.{}: has {} values but the data has {} channels", section,
                                    key, v.size(), shape.channels));
    }
  };
  check(config.mean, "mean");
  check(config.std, "std");
  t.mean.assign(config.mean.begin(), config.mean.end());
  t.std.assign(config.std.begin(), config.std.end());
  t.augmentation = config.augment;
  t.augment = training && (config.augment.hflip || config.augment.cropPadding > 0);
  return t;
}

void applyTransform(const Transform& t, const SampleShape& shape, float* pixels, float* scratch,
                    uint64_t seed) {
  const int64_t C = shape.channels, H = shape.height, W = shape.width;
  if (t.augment) {
    detail::Rng rng(seed);
    const bool flip = t.augmentation.hflip && (rng.next() & 1u);
    const int64_t pad = t.augmentation.cropPadding;
    const int64_t dy = pad > 0 ? static_cast<int64_t>(rng.below(2 * pad + 1)) - pad : 0;
    const int64_t dx = pad > 0 ? static_cast<int64_t>(rng.below(2 * pad + 1)) - pad : 0;
    if (flip || dx != 0 || dy != 0) {
      std::memcpy(scratch, pixels, sizeof(float) * static_cast<size_t>(shape.numel()));
      for (int64_t c = 0; c < C; ++c) {
        const float* src = scratch + c * H * W;
        float* dst = pixels + c * H * W;
        for (int64_t y = 0; y < H; ++y) {
          const int64_t sy = y + dy;
          for (int64_t x = 0; x < W; ++x) {
            int64_t sx = (flip ? W - 1 - x : x) + dx;
            dst[y * W + x] = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? src[sy * W + sx] : 0.0f;
          }
        }
      }
    }
  }
  if (!t.mean.empty()) {
    for (int64_t c = 0; c < C; ++c) {
      const float m = t.mean.size() == 1 ? t.mean[0] : t.mean[static_cast<size_t>(c)];
      const float inv = 1.0f / (t.std.size() == 1 ? t.std[0] : t.std[static_cast<size_t>(c)]);
      float* p = pixels + c * H * W;
      for (int64_t i = 0; i < H * W; ++i) p[i] = (p[i] - m) * inv;
    }
  }
}

}  // namespace cohort::data
