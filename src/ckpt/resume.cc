#include "cohort/ckpt/resume.h"

#include <fmt/format.h>

#include <filesystem>

#include "cohort/ckpt/manifest.h"
#include "cohort/core/error.h"

namespace fs = std::filesystem;

namespace cohort::ckpt {

std::optional<ResumePoint> newestValidCheckpoint(const std::string& dir,
                                                 std::vector<std::string>* skipped) {
  const auto dirs = listCheckpointDirs(dir);
  std::vector<std::string> bad;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    std::error_code ec;
    if (!fs::exists(it->path + "/manifest.json", ec)) continue;  // never committed
    Verification v = verifyCheckpoint(it->path, true);
    if (v.valid) {
      if (skipped) *skipped = bad;
      return ResumePoint{it->path, it->step, bad};
    }
    bad.push_back(fmt::format("{}: {}", it->path, v.problem));
  }
  if (skipped) *skipped = bad;
  return std::nullopt;
}

ResumePoint resolveResumePath(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    throw DataError(fmt::format("--resume {}: no such directory", path));
  }
  if (fs::exists(path + "/manifest.json", ec)) {
    Verification v = verifyCheckpoint(path, true);
    if (!v.valid) throw DataError(fmt::format("--resume {}: not a valid checkpoint: {}", path, v.problem));
    return ResumePoint{path, v.manifest->step, {}};
  }
  std::vector<std::string> skipped;
  for (const std::string& dir : {path, path + "/checkpoints"}) {
    if (auto p = newestValidCheckpoint(dir, &skipped)) return *p;
    if (!skipped.empty()) {
      throw DataError(fmt::format("--resume {}: no valid checkpoint; {}", path,
                                  fmt::join(skipped, "; ")));
    }
  }
  throw DataError(fmt::format("--resume {}: holds no checkpoint (step-<N> directories with a "
                              "manifest.json)",
                              path));
}

}  // namespace cohort::ckpt
