#pragma once

// A checkpoint is a directory `step-<N>/` holding its files and, written last
// and atomically, `manifest.json`. A directory without a valid manifest is not
// a checkpoint. docs/checkpoint-format.md describes every field.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace cohort::ckpt {

inline constexpr int kCheckpointFormatVersion = 1;

struct ManifestFile {
  std::string name;      // relative to the checkpoint directory
  uint64_t size = 0;
  std::string checksum;  // XXH3-64, hex
  int rank = -1;         // the rank that wrote it (-1: shared state written by rank 0)
};

struct Manifest {
  int formatVersion = kCheckpointFormatVersion;
  int64_t step = 0;             // optimizer steps completed
  int64_t epoch = 1;            // 1-based epoch the next batch belongs to
  int64_t batchInEpoch = 0;     // micro-batches each rank consumed in that epoch
  int64_t samplesInEpoch = 0;   // positions of the epoch's permutation consumed, all ranks
  int worldSize = 1;
  std::string jobHash;
  std::string created;          // UTC, ISO 8601
  std::vector<ManifestFile> files;
  nlohmann::json extra = nlohmann::json::object();  // lr, optimizer, counters
};

nlohmann::json toJson(const Manifest& m);
// Throws DataError naming `origin` and the missing or malformed field.
Manifest manifestFromJson(const nlohmann::json& j, const std::string& origin);
// Reads <dir>/manifest.json. Throws DataError/IoError.
Manifest readManifest(const std::string& dir);
// Writes <dir>/manifest.json atomically (fsync'd, renamed into place).
void writeManifest(const std::string& dir, const Manifest& m);

// The layout that wrote `m`: its pipeline's stages (extra.pipeline) and
// its tensor split's slices (extra.tensor); 1 when it had none. Throws
// DataError for a count that is not an integer.
int checkpointStages(const Manifest& m);
int checkpointSlices(const Manifest& m);

std::string checkpointDirName(int64_t step);  // "step-<N>"

struct CheckpointDir {
  int64_t step = 0;
  std::string path;
};
// The step-<N> directories under `dir`, by ascending step; none if `dir`
// does not exist.
std::vector<CheckpointDir> listCheckpointDirs(const std::string& dir);

struct Verification {
  bool valid = false;
  std::string problem;  // why not, naming the file
  std::optional<Manifest> manifest;
  uint64_t bytes = 0;   // total size of the files
};
// Checks the manifest and that every file it lists exists with its size;
// with `checksums`, also hashes every file and authenticates every encrypted
// one when a keyring is installed (security::installedKeyring()).
Verification verifyCheckpoint(const std::string& path, bool checksums);

// Which checkpoint directories the retention policy deletes: every directory
// older than the newest valid one that is neither among the `keepLast`
// newest valid ones nor a valid multiple of `keepEvery` (0: none). The newest
// valid checkpoint and anything newer are never chosen. `valid[i]` says
// whether dirs[i] holds a valid manifest.
std::vector<std::string> retentionVictims(const std::vector<CheckpointDir>& dirs,
                                          const std::vector<bool>& valid, int64_t keepLast,
                                          int64_t keepEvery);

}  // namespace cohort::ckpt
