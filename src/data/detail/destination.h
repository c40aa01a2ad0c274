#pragma once

// Where a packed dataset is written (`cohort data pack`, `cohort data
// tokenize`): a local directory, or a blob URL.

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/data/dataset_manifest.h"
#include "cohort/storage/storage.h"

namespace cohort::data::detail {

// Where the packed dataset goes: a directory, or a blob URL (shards are
// written to a temporary directory, uploaded, and that directory removed
// when the Destination is destroyed).
class Destination {
 public:
  Destination(const std::string& dst, const storage::StorageOptions& so)
      : remote_(storage::isRemoteUrl(dst)), work_(dst) {
    if (remote_) {
      out_ = storage::openStorage(dst, so);
      try {
        storage::createContainer(dst, so);
      } catch (const storage::StorageError& e) {
        // A SAS may allow writing blobs but not creating containers; the
        // writes tell whether the container is usable.
        if (e.status() != 403) throw;
      }
      static std::atomic<int> made{0};
      work_ = (std::filesystem::temp_directory_path() /
               fmt::format("cohort-pack-{}-{}", ::getpid(), made++))
                  .string();
    }
    std::error_code ec;
    std::filesystem::create_directories(work_, ec);
    if (ec) throw IoError(fmt::format("{}: cannot create: {}", work_, ec.message()));
    // A dataset already there stops being one before its shards are
    // overwritten: an interrupted pack leaves no manifest that lies.
    remove(kDatasetManifestName);
  }
  ~Destination() {
    std::error_code e;
    if (remote_) std::filesystem::remove_all(work_, e);
  }
  Destination(const Destination&) = delete;
  Destination& operator=(const Destination&) = delete;

  // Where a shard is written before put().
  std::string scratch(const std::string& name) const { return work_ + "/" + name + ".tmp"; }
  // Publishes a shard written at scratch(name). Several threads may call it.
  void put(const std::string& name) const {
    if (remote_) {
      out_->writeFromFile(name, scratch(name));
      std::filesystem::remove(scratch(name));
    } else {
      std::filesystem::rename(scratch(name), work_ + "/" + name);
    }
  }
  void remove(const std::string& name) const {
    std::error_code ec;
    if (remote_) {
      out_->remove(name);
    } else {
      std::filesystem::remove(work_ + "/" + name, ec);
    }
  }
  void writeManifest(const std::string& json) const {
    if (remote_) {
      out_->writeBytes(kDatasetManifestName, json);
    } else {
      writeFileAtomic(work_ + "/" + kDatasetManifestName, json);
    }
  }

 private:
  bool remote_;
  std::string work_;
  std::unique_ptr<storage::Storage> out_;
};

}  // namespace cohort::data::detail
