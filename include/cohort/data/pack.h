#pragma once

// `cohort data pack|inspect|verify`: make, look into and check packed
// datasets (docs/shard-format.md).

#include <cstdint>
#include <ostream>
#include <string>

#include "cohort/data/dataset_manifest.h"
#include "cohort/storage/storage.h"

namespace cohort::security {
struct Key;
}

namespace cohort::data {

struct PackOptions {
  int64_t shardBytes = 256'000'000;  // target shard size
  int threads = 0;                   // 0: the machine's cores
  uint64_t seed = 0;                 // order of the records across shards
  std::string labels;                // IDX: labels file; empty: derived from the images file name
  std::string name;                  // dataset name; empty: SRC's last path component
  bool progress = true;              // a progress line on stderr
  storage::StorageOptions storage;   // DST is a blob URL
  // Seal every shard with this key (docs/security.md); null: plain shards.
  const security::Key* key = nullptr;
};

struct PackResult {
  DatasetManifest manifest;
  int64_t skipped = 0;  // files that are not readable images (each named in a warning)
};

// Packs SRC, an ImageNet-style folder (one subfolder per class holding JPEG or
// PNG files; class index = sorted folder name) or an IDX images file (MNIST
// family), into shards at DST, a local directory or blob URL. Records are
// shuffled across shards by `seed`, so each shard holds a mix of classes.
// Shards are written in parallel; dataset.json is written last. Throws
// DataError for unusable input, naming the path.
PackResult pack(const std::string& src, const std::string& dst, const PackOptions& options);

// One screen about a packed dataset: classes, counts, sizes, shards, and the
// first `records` records (key, label, bytes). Returns the exit code.
int inspectCommand(const std::string& path, int64_t records, const storage::StorageOptions& so,
                   std::ostream& out);

// Reads every shard whole: size and checksum against dataset.json, the
// index, every record's checksum and label, and with `decode` every image.
// Prints one line per shard; 0 when all is well, 1 naming each problem with
// its shard and offset.
int verifyCommand(const std::string& path, bool decode, const storage::StorageOptions& so,
                  std::ostream& out);

}  // namespace cohort::data
