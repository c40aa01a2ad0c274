#pragma once

// ModelInfo of an image classifier for tests that stand in for a trained
// model (in-process routes, request parsing): raw pixels of `channels` x
// `height` x `width`, mean 0.5 and std 0.5 per channel, `classes` classes.

#include <cstdint>

#include "cohort/serve/model.h"

namespace cohort::test {

inline serve::ModelInfo imageModelInfo(int64_t channels, int64_t height, int64_t width, int64_t classes) {
  serve::ModelInfo m;
  m.arch = "simple_cnn";
  m.channels = channels;
  m.height = height;
  m.width = width;
  m.mean.assign(static_cast<size_t>(channels), 0.5);
  m.std.assign(static_cast<size_t>(channels), 0.5);
  m.numClasses = classes;
  return m;
}

}  // namespace cohort::test
