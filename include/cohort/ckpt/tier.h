#pragma once

// Storage tiers of checkpoints behind the local disk.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/ckpt/manifest.h"
#include "cohort/storage/storage.h"

namespace cohort::ckpt {

// A slower, more durable tier behind the local disk: a mounted file system
// or blob storage. The checkpoint writer uploads each committed checkpoint
// after the local commit; resume downloads the newest one when the local
// disk has none. A checkpoint is in the tier once its manifest is: uploads
// write the manifest last, removals delete it first.
class RemoteTier {
 public:
  virtual ~RemoteTier() = default;
  virtual std::string describe() const = 0;
  // Uploads a committed checkpoint directory, its manifest last.
  virtual void upload(const std::string& localDir, const Manifest& manifest) = 0;
  // Steps of the checkpoints it holds with a manifest, ascending.
  virtual std::vector<int64_t> list() = 0;
  // Downloads checkpoint `step` into `localDir`, the manifest last.
  virtual void download(int64_t step, const std::string& localDir) = 0;
  virtual void remove(int64_t step) = 0;
};

// A remote tier on a mounted file system (NFS, a second disk): `root` holds
// step-<N> directories laid out as on the local disk.
std::shared_ptr<RemoteTier> directoryTier(const std::string& root);

// A remote tier in any storage (storage/storage.h): objects
// step-<N>/<file> and step-<N>/manifest.json under the storage's root.
std::shared_ptr<RemoteTier> storageTier(std::shared_ptr<storage::Storage> storage);

// The tier `spec` names: a blob URL (az://, https://, http:// for the
// emulator; a storage tier reached with `options`) or a path (a directory
// tier). Throws ConfigError for a malformed URL, an unknown scheme or missing
// credentials.
std::shared_ptr<RemoteTier> openTier(const std::string& spec,
                                     const storage::StorageOptions& options);

}  // namespace cohort::ckpt
