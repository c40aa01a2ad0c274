#pragma once

// What `cohort score` reads: DATA opened as a list of samples in input order,
// each with an id, a true label when the data has one, and its input in the
// form a Predictor takes (serve/model.h). docs/deploy.md ("Batch scoring")
// lists the forms of DATA:
//
//   - a directory without dataset.json: image folders, every JPEG/PNG under
//     it (recursively) sorted by relative path, which is the id; the label
//     is the class whose name is the first folder of that path, if any;
//   - a directory or blob URL holding dataset.json: image shards (id: the
//     record's key) or token shards (windows of block_size + 1 tokens);
//   - an IDX images file, its labels file beside it if there is one;
//   - a YAML file (.yaml, .yml) holding one dataset section of a job (the
//     keys of data.train: kind, path, images, labels, limit, ...).
//
// Encoded images go through serve's evalTransform and pixelsFromImage
// (serve/model.h: ModelInfo.resize, center crop, the 64 Mpx limit), as an
// image request to `cohort serve` does, not through the dataset section's
// crop_size or normalization.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cohort/serve/model.h"
#include "cohort/storage/storage.h"

namespace cohort::serve::detail {

struct ScoreItem {
  nlohmann::json id;              // a path or record key (string), or a position (integer)
  std::optional<int64_t> label;   // the true class, as the model numbers its classes
  std::string error;              // not empty: the sample cannot be read (an undecodable image)
};

// One rank reads samples one at a time, in any order; not thread-safe.
class ScoreData {
 public:
  virtual ~ScoreData() = default;
  virtual int64_t size() const = 0;
  virtual bool tokens() const = 0;
  // "image folder /data/val (5000 images)": for logs and summary.json.
  virtual std::string describe() const = 0;
  // Changes when the samples do (names and sizes of the files, the dataset
  // manifest, the IDX bytes): how a rerun knows it reads the same data.
  virtual std::string fingerprint() const = 0;
  // A hint: this process reads [begin, end) next (blob shards are fetched ahead).
  virtual void willRead(int64_t begin, int64_t end) { (void)begin, (void)end; }
  // Images: writes sample `index` as raw pixels (channels x height x width
  // floats in 0..255) to `out`. A sample that cannot be decoded (or is over
  // kMaxImagePixels by its header) comes back with `error` set (out is then unspecified); missing or corrupt
  // containers (a truncated shard) throw DataError.
  virtual ScoreItem readImage(int64_t index, float* out);
  // Tokens: writes window `index` (block_size + 1 ids) to `out`.
  virtual ScoreItem readTokens(int64_t index, int64_t* out);
};

// Opens DATA for the model `info` describes. Throws UsageError (DATA does
// not exist or is none of the forms above), DataError (unreadable data, or
// data that does not fit the model: image data for a language model, an
// input size other than the model's) or ConfigError (a YAML section).
// Blob URLs (DATA itself, or a section's path) are read with `storage`.
std::unique_ptr<ScoreData> openScoreData(const std::string& data, const ModelInfo& info,
                                         const storage::StorageOptions& storage);

}  // namespace cohort::serve::detail
