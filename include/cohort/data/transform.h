#pragma once

// Per-sample transforms applied while a batch is built: augmentation
// (training only) and per-channel normalization.

#include <cstdint>
#include <vector>

#include "cohort/config/job.h"
#include "cohort/data/dataset.h"

namespace cohort::data {

struct Transform {
  std::vector<float> mean;  // per channel (or one value for all); empty: none
  std::vector<float> std;
  bool augment = false;     // apply `augmentation`
  AugmentConfig augmentation;

  // From a dataset section; checks mean/std against the channel count.
  // Throws ConfigError naming the key when they do not fit.
  static Transform fromConfig(const DatasetConfig& config, const SampleShape& shape,
                              bool training, const std::string& section);
};

// Transforms one sample in place (`pixels` holds shape.numel() floats).
// `scratch` must hold as many floats. Random choices come from `seed` alone,
// so a sample is transformed the same way whichever thread builds it.
void applyTransform(const Transform& t, const SampleShape& shape, float* pixels, float* scratch,
                    uint64_t seed);

}  // namespace cohort::data
