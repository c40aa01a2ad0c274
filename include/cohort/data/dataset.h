#pragma once

// Random-access labelled images. Implementations: IDX files (MNIST,
// Fashion-MNIST) and synthetic samples. Reads are thread-safe, so the loader's
// threads share one dataset.

#include <cstdint>
#include <memory>
#include <string>

#include "cohort/config/job.h"

namespace cohort::data {

struct SampleShape {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t numel() const { return channels * height * width; }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual SampleShape shape() const = 0;
  // Writes sample `index` (0 <= index < size()) as channel-major float pixels
  // in [0, 1] to `out` (shape().numel() floats) and returns its label.
  virtual int64_t read(int64_t index, float* out) const = 0;
  // One line for logs: "idx /path/train-images-idx3-ubyte.gz (60000 x 1x28x28)".
  virtual std::string describe() const = 0;
};

// Opens the dataset a job section names. Labels must be below numClasses.
// Throws DataError naming the file for missing, truncated or corrupt data.
std::shared_ptr<Dataset> openDataset(const DatasetConfig& config, int64_t numClasses);

// IDX files (raw or gzip): images of ndim 3 (N, H, W) and labels of ndim 1,
// unsigned bytes. `limit` > 0 keeps the first `limit` samples.
std::shared_ptr<Dataset> openIdx(const std::string& images, const std::string& labels,
                                 int64_t limit, int64_t numClasses);

// Deterministic synthetic samples: sample i depends only on (seed, i).
// Its label is a hash of (seed, i); its pixels are noise around a pattern
// that depends only on the label, so a model can learn them and a model
// trained on one seed is evaluated meaningfully on another.
std::shared_ptr<Dataset> makeSynthetic(int64_t size, SampleShape shape, int64_t numClasses,
                                       uint64_t seed);

}  // namespace cohort::data
