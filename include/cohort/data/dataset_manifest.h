#pragma once

// dataset.json: what a packed dataset holds (docs/shard-format.md).

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::data {

constexpr int kDatasetFormatVersion = 1;
constexpr const char* kDatasetManifestName = "dataset.json";

struct ShardInfo {
  std::string name;      // file name relative to the dataset root
  int64_t records = 0;
  int64_t bytes = 0;      // of the file as stored (sealed, when encrypted)
  std::string checksum;  // XXH3-64 of the whole file as stored, 16 hex digits
};

struct DatasetManifest {
  int formatVersion = kDatasetFormatVersion;
  std::string name;
  // "image": payloads are encoded images (JPEG or PNG); "raw": payloads are
  // uint8 pixels of `rawShape` (channels, height, width), channel-major;
  // "tokens": shards are token files (docs/token-format.md) and a shard's
  // `records` count its tokens.
  std::string encoding = "image";
  std::vector<int64_t> rawShape;
  // tokens: how text became tokens ("bytes": token = byte value;
  // "sentencepiece": the model in `tokenizerModel`, a file of the dataset
  // with XXH3-64 `tokenizerChecksum`; "huggingface": likewise, a
  // tokenizer.json), the number of distinct ids (every
  // token is below it), the bytes of a token in the shards (2: uint16, 4:
  // uint32 for vocab_size above 65536), and the bytes of text the tokens
  // came from (0: not recorded; the loss per byte divides by it).
  std::string tokenizer;
  int64_t vocabSize = 0;
  int tokenBytes = 2;
  std::string tokenizerModel, tokenizerChecksum;
  int64_t textBytes = 0;
  std::vector<std::string> classes;  // class names; label = position
  std::string source;                // what was packed, for people
  std::string created;               // UTC, ISO 8601
  std::vector<ShardInfo> shards;
  // The id of the key every shard is sealed with (docs/security.md); empty:
  // plain shards.
  std::string encryptionKeyId;

  int64_t records() const;
  int64_t bytes() const;
};

// JSON text of a manifest, and back. parseDatasetManifest throws DataError
// naming `where` (a path or URL) and the field that is missing or wrong.
std::string datasetManifestJson(const DatasetManifest& m);
DatasetManifest parseDatasetManifest(const std::string& text, const std::string& where);

}  // namespace cohort::data
