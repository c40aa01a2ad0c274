#include "cohort/ckpt/tier.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
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

}  // namespace

std::shared_ptr<RemoteTier> directoryTier(const std::string& root) {
  return std::make_shared<DirectoryTier>(root);
}

std::shared_ptr<RemoteTier> openTier(const std::string& spec) {
  const auto scheme = spec.find("://");
  if (scheme != std::string::npos) {
    throw ConfigError(fmt::format(
        "checkpoint.remote: '{}': remote storage by URL is not available in this build yet; "
        "give a directory path (a mounted file system)",
        spec.substr(0, scheme + 3)));
  }
  return directoryTier(spec);
}

}  // namespace cohort::ckpt
