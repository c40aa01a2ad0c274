#pragma once

// Storage tiers of checkpoints behind the local disk.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/ckpt/manifest.h"

namespace cohort::ckpt {

// A slower, more durable tier behind the local disk: a mounted file system
// now, blob storage later. The checkpoint writer uploads each committed
// checkpoint after the local commit; resume downloads the newest one when
// the local disk has none.
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

// The tier `spec` names: a path (a directory tier). Throws ConfigError for a
// scheme this build cannot reach.
std::shared_ptr<RemoteTier> openTier(const std::string& spec);

}  // namespace cohort::ckpt
