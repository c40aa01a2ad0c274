#pragma once

// Random-access samples: labelled images (IDX files of the MNIST family,
// packed shards, synthetic samples) or windows of tokens (token shards,
// data/tokens.h). Reads are thread-safe, so the loader's threads share one
// dataset.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/config/job.h"
#include "cohort/storage/storage.h"

namespace cohort::data {

class ShardSource;  // data/shard_source.h

struct SampleShape {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t numel() const { return channels * height * width; }
};

// What a sample is. An image sample is shape() float pixels and a label; a
// tokens sample is a window of shape().width token ids (shape 1 x 1 x window),
// whose first window - 1 tokens are the input and last window - 1 the targets
// (or, for masked language modelling, all of them both); a text sample is
// shape().width token ids (a labelled text, padded) and a label.
enum class SampleKind { image, tokens, text };

// read() returns this instead of a label for a sample that cannot be decoded
// and is skipped (data.*.on_corrupt: skip); the dataset has logged its key.
constexpr int64_t kSkippedSample = -1;

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual SampleShape shape() const = 0;
  // Writes sample `index` (0 <= index < size()) as channel-major float pixels
  // in [0, 1] to `out` (shape().numel() floats) and returns its label, or
  // kSkippedSample. `seed` drives any random choice made while decoding (a
  // random crop), so a sample comes out the same whichever thread reads it.
  // Token datasets throw std::logic_error.
  virtual int64_t read(int64_t index, float* out, uint64_t seed) const = 0;
  int64_t read(int64_t index, float* out) const { return read(index, out, 0); }
  virtual SampleKind kind() const { return SampleKind::image; }
  // tokens: every id is below it; 0 for images.
  virtual int64_t vocabSize() const { return 0; }
  // tokens: bytes of text per token (what the tokens came from over their
  // count), so that a loss per token becomes one per byte; 0 when unknown.
  virtual double bytesPerToken() const { return 0; }
  // tokens: writes window `index`'s shape().width token ids to `out`. `seed`
  // drives where a training window starts; the loader gives every window of
  // an epoch the same one (training seed, epoch), so they move together.
  // Image datasets throw std::logic_error.
  virtual void readTokens(int64_t index, int64_t* out, uint64_t seed) const;
  // text: writes sample `index`'s shape().width token ids to `out` and
  // returns its label. Other datasets throw std::logic_error.
  virtual int64_t readText(int64_t index, int64_t* out) const;
  // tokens, text: the id of the tokenizer's special token `token` ("[MASK]",
  // "[PAD]"), or -1 when it has none; -1 for images.
  virtual int64_t tokenId(const std::string& token) const {
    (void)token;
    return -1;
  }
  // One line for logs: "idx /path/train-images-idx3-ubyte.gz (60000 x 1x28x28)".
  virtual std::string describe() const = 0;
  // The order an epoch visits all samples in when shuffling, the same on
  // every rank: a uniform permutation of (seed, epoch) unless the storage
  // layout calls for another (shards: see shuffledShardOrder).
  virtual std::vector<int64_t> shuffledOrder(uint64_t seed, int64_t epoch) const;
  // A hint: this process is about to read `indices` in this order, so data
  // held remotely can be fetched ahead.
  virtual void willRead(const std::vector<int64_t>& indices) const { (void)indices; }
  // Where the bytes read so far came from, for the log after each epoch
  // ("blob: 120 MB in 950 ranged reads; cache: 3 shards downloaded, 80 MB
  // read from local disk"); empty when there is nothing to say.
  virtual std::string ioSummary() const { return {}; }
};

// How datasets reach blob storage, and whether they are read for training
// (random crops) or evaluation.
struct OpenOptions {
  bool training = false;
  // tokens: tokens per sample (model.block_size + 1, or block_size for
  // masked language modelling); text: tokens per text, padded or cut.
  int64_t tokenWindow = 0;
  storage::StorageOptions storage;
  CacheConfig cache;
};

// Opens the dataset a job section names. Labels must be below numClasses.
// Throws DataError naming the file for missing, truncated or corrupt data.
std::shared_ptr<Dataset> openDataset(const DatasetConfig& config, int64_t numClasses,
                                     const OpenOptions& options = {});

// Packed shards (docs/shard-format.md) at a directory or blob URL.
std::shared_ptr<Dataset> openShards(const DatasetConfig& config, int64_t numClasses,
                                    const OpenOptions& options);

// Token shards (docs/token-format.md) at a directory or blob URL, read in
// windows of options.tokenWindow tokens.
std::shared_ptr<Dataset> openTokens(const DatasetConfig& config, const OpenOptions& options);
// The same, reading through `source`, already open at config.path (its
// manifest is not read again; options.storage and options.cache are its own).
std::shared_ptr<Dataset> openTokens(const DatasetConfig& config, const OpenOptions& options,
                                    std::unique_ptr<ShardSource> source);

// Labelled texts (docs/data.md, "Labelled texts"): config.path a text file
// of lines `LABEL<TAB>TEXT`, LABEL below numClasses, each text tokenized by
// config.tokenizer as [CLS] text [SEP] padded with [PAD] (or cut) to
// options.tokenWindow tokens. Throws DataError naming the file and line of
// a line without a label or with a label that is not a class, and the
// tokenizer when it lacks [CLS], [SEP] or [PAD].
std::shared_ptr<Dataset> openTextClasses(const DatasetConfig& config, int64_t numClasses, const OpenOptions& options);

// IDX files (raw or gzip): images of ndim 3 (N, H, W) and labels of ndim 1,
// unsigned bytes. `limit` > 0 keeps the first `limit` samples. `labels`
// empty: images without labels (`cohort score`), every label reads as 0.
std::shared_ptr<Dataset> openIdx(const std::string& images, const std::string& labels,
                                 int64_t limit, int64_t numClasses);

// Deterministic synthetic samples: sample i depends only on (seed, i).
// Its label is a hash of (seed, i); its pixels are noise around a pattern
// that depends only on the label, so a model can learn them and a model
// trained on one seed is evaluated meaningfully on another.
std::shared_ptr<Dataset> makeSynthetic(int64_t size, SampleShape shape, int64_t numClasses,
                                       uint64_t seed);

}  // namespace cohort::data
