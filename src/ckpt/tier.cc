#include "cohort/ckpt/tier.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/core/file.h"

namespace fs = std::filesystem;

namespace cohort::ckpt {
namespace {

// Copies `from` to `to` through a temporary name, so `to` is whole or absent.
void copyFileAtomic(const std::string& from, const std::string& to) {
  const std::string tmp = to + ".partial";
  std::error_code ec;
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
  if (!ec) fs::rename(tmp, to, ec);
  if (ec) {
    fs::remove(tmp);
    throw IoError(fmt::format("cannot copy {} to {}: {}", from, to, ec.message()));
  }
}

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot read {}", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class DirectoryTier final : public RemoteTier {
 public:
  explicit DirectoryTier(std::string root) : root_(std::move(root)) {}
  std::string describe() const override { return root_; }

  void upload(const std::string& localDir, const Manifest& manifest) override {
    copyDir(localDir, root_ + "/" + checkpointDirName(manifest.step), manifest);
  }
  std::vector<int64_t> list() override {
    std::vector<int64_t> steps;
    for (const auto& d : listCheckpointDirs(root_)) {
      if (verifyCheckpoint(d.path, false).valid) steps.push_back(d.step);
    }
    return steps;
  }
  void download(int64_t step, const std::string& localDir) override {
    const std::string from = root_ + "/" + checkpointDirName(step);
    copyDir(from, localDir, readManifest(from));
  }
  void remove(int64_t step) override {
    std::error_code ec;
    fs::remove_all(root_ + "/" + checkpointDirName(step), ec);
    if (ec) throw IoError(fmt::format("cannot delete {}/{}: {}", root_, checkpointDirName(step), ec.message()));
  }

 private:
  static void copyDir(const std::string& from, const std::string& to, const Manifest& m) {
    std::error_code ec;
    fs::create_directories(to, ec);
    if (ec) throw IoError(fmt::format("cannot create {}: {}", to, ec.message()));
    fs::remove(to + "/manifest.json", ec);
    for (const auto& f : m.files) copyFileAtomic(from + "/" + f.name, to + "/" + f.name);
    writeFileAtomic(to + "/manifest.json", readText(from + "/manifest.json"));
  }
  std::string root_;
};

// Objects step-<N>/<file> in a Storage. A step is listed once its manifest
// object exists: upload() writes it last, remove() deletes it first.
class StorageTier final : public RemoteTier {
 public:
  explicit StorageTier(std::shared_ptr<storage::Storage> storage) : storage_(std::move(storage)) {}
  std::string describe() const override { return storage_->describe(); }

  void upload(const std::string& localDir, const Manifest& manifest) override {
    const std::string dir = checkpointDirName(manifest.step);
    // A partial earlier upload of this step must not pass for a complete one.
    storage_->remove(dir + "/manifest.json");
    for (const auto& f : manifest.files) {
      storage_->writeFromFile(dir + "/" + f.name, localDir + "/" + f.name);
    }
    storage_->writeFromFile(dir + "/manifest.json", localDir + "/manifest.json");
  }

  std::vector<int64_t> list() override {
    static const std::string kSuffix = "/manifest.json";
    std::vector<int64_t> steps;
    for (const auto& o : storage_->list("step-")) {
      const std::string& n = o.name;
      if (n.size() <= 5 + kSuffix.size() ||
          n.compare(n.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
        continue;
      }
      const std::string digits = n.substr(5, n.size() - 5 - kSuffix.size());
      if (digits.empty() || digits.size() > 18 ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        continue;
      }
      steps.push_back(std::stoll(digits));
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }

  void download(int64_t step, const std::string& localDir) override {
    const std::string dir = checkpointDirName(step);
    const std::string manifestName = dir + "/manifest.json";
    const std::string text = storage_->readRange(manifestName, 0, storage_->size(manifestName));
    const std::string origin = storage_->describe() + "/" + manifestName;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: not valid JSON: {}", origin, e.what()));
    }
    const Manifest m = manifestFromJson(j, origin);
    std::error_code ec;
    fs::create_directories(localDir, ec);
    if (ec) throw IoError(fmt::format("cannot create {}: {}", localDir, ec.message()));
    fs::remove(localDir + "/manifest.json", ec);
    for (const auto& f : m.files) {
      const std::string to = localDir + "/" + f.name;
      const std::string tmp = to + ".partial";
      storage_->readToFile(dir + "/" + f.name, tmp);
      const auto got = fs::file_size(tmp, ec);
      if (ec || got != f.size) {
        fs::remove(tmp, ec);
        throw DataError(fmt::format("{}/{}/{}: expected {} bytes as the manifest says, got {}",
                                    storage_->describe(), dir, f.name, f.size, got));
      }
      fs::rename(tmp, to, ec);
      if (ec) throw IoError(fmt::format("cannot rename {} to {}: {}", tmp, to, ec.message()));
    }
    writeFileAtomic(localDir + "/manifest.json", text);
  }

  void remove(int64_t step) override {
    const std::string dir = checkpointDirName(step);
    storage_->remove(dir + "/manifest.json");  // first: the step leaves list() at once
    for (const auto& o : storage_->list(dir + "/")) storage_->remove(o.name);
  }

 private:
  std::shared_ptr<storage::Storage> storage_;
};

}  // namespace

std::shared_ptr<RemoteTier> directoryTier(const std::string& root) {
  return std::make_shared<DirectoryTier>(root);
}

std::shared_ptr<RemoteTier> storageTier(std::shared_ptr<storage::Storage> storage) {
  return std::make_shared<StorageTier>(std::move(storage));
}

std::shared_ptr<RemoteTier> openTier(const std::string& spec,
                                     const storage::StorageOptions& options) {
  if (storage::isRemoteUrl(spec)) return storageTier(storage::openStorage(spec, options));
  if (spec.rfind("file://", 0) == 0) return directoryTier(spec.substr(7));
  const auto scheme = spec.find("://");
  if (scheme != std::string::npos) {
    throw ConfigError(fmt::format(
        "checkpoint.remote: '{}': unknown scheme; give a directory path (a mounted file "
        "system) or a blob URL (az://, https://)",
        storage::redactUrl(spec)));
  }
  return directoryTier(spec);
}

}  // namespace cohort::ckpt
