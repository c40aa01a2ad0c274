#include "cohort/ckpt/tools.h"

#include <fmt/format.h>

#include <algorithm>

#include <filesystem>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/resume.h"
#include "cohort/core/error.h"
#include "cohort/core/text.h"

namespace fs = std::filesystem;

namespace cohort::ckpt {
namespace {

// The checkpoint directories PATH names.
std::vector<CheckpointDir> dirsOf(const std::string& path) {
  std::error_code ec;
  if (fs::exists(path + "/manifest.json", ec)) {
    const std::string name = fs::path(path).lexically_normal().filename().string();
    int64_t step = -1;
    if (name.rfind("step-", 0) == 0) {
      try {
        step = std::stoll(name.substr(5));
      } catch (const std::exception&) {
      }
    }
    return {{step, path}};
  }
  auto dirs = listCheckpointDirs(path);
  if (dirs.empty()) dirs = listCheckpointDirs(path + "/checkpoints");
  if (dirs.empty()) {
    // A step directory whose manifest is missing.
    const std::string name = fs::path(path).lexically_normal().filename().string();
    if (name.rfind("step-", 0) == 0 && fs::is_directory(path, ec)) return {{-1, path}};
  }
  return dirs;
}

}  // namespace

int listCommand(const std::string& path, std::ostream& out) {
  const auto dirs = dirsOf(path);
  if (dirs.empty()) {
    out << "no checkpoints in " << path << "\n";
    return 2;
  }
  out << fmt::format("{:>10} {:>6} {:>8} {:>6} {:>11}  {:<20}  {}\n", "STEP", "EPOCH", "BATCH",
                     "RANKS", "SIZE", "CREATED", "STATUS");
  for (const auto& d : dirs) {
    std::error_code ec;
    if (!fs::exists(d.path + "/manifest.json", ec)) {
      out << fmt::format("{:>10} {:>6} {:>8} {:>6} {:>11}  {:<20}  incomplete (no manifest): {}\n",
                         d.step, "-", "-", "-", "-", "-", d.path);
      continue;
    }
    Verification v = verifyCheckpoint(d.path, false);
    if (!v.manifest) {
      out << fmt::format("{:>10} {:>6} {:>8} {:>6} {:>11}  {:<20}  invalid: {}\n", d.step, "-",
                         "-", "-", "-", "-", v.problem);
      continue;
    }
    const Manifest& m = *v.manifest;
    out << fmt::format("{:>10} {:>6} {:>8} {:>6} {:>11}  {:<20}  {}\n", m.step, m.epoch,
                       m.batchInEpoch, m.worldSize, humanBytes(v.bytes), m.created,
                       v.valid ? "valid (sizes; `cohort ckpt verify` checks contents)"
                               : "invalid: " + v.problem);
  }
  return 0;
}

int verifyCommand(const std::string& path, std::ostream& out) {
  const auto dirs = dirsOf(path);
  if (dirs.empty()) {
    out << "no checkpoints in " << path << "\n";
    return 2;
  }
  int bad = 0, good = 0;
  for (const auto& d : dirs) {
    std::error_code ec;
    if (!fs::exists(d.path + "/manifest.json", ec)) {
      out << fmt::format("INCOMPLETE {} (no manifest: never committed, never resumed from)\n", d.path);
      continue;
    }
    Verification v = verifyCheckpoint(d.path, true);
    if (v.valid) {
      ++good;
      out << fmt::format("OK      {} ({} files, {})\n", d.path, v.manifest->files.size(),
                         humanBytes(v.bytes));
    } else {
      ++bad;
      out << fmt::format("CORRUPT {}: {}\n", d.path, v.problem);
    }
  }
  if (bad > 0) {
    out << fmt::format("{} of {} checkpoints failed verification\n", bad, bad + good);
    return 1;
  }
  if (good == 0) return 2;
  return 0;
}

std::string findCheckpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(path + "/manifest.json", ec)) return path;
  if (auto p = newestValidCheckpoint(path)) return p->path;
  if (auto q = newestValidCheckpoint(path + "/checkpoints")) return q->path;
  return "";
}

}  // namespace cohort::ckpt
