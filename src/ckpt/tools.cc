#include "cohort/ckpt/tools.h"

#include <fmt/format.h>

#include <algorithm>

#include <filesystem>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/resume.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/error.h"

namespace fs = std::filesystem;

namespace cohort::ckpt {
namespace {

std::string humanBytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", double(b) / double(1 << 30));
  if (b >= (uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", double(b) / 1024);
  return fmt::format("{} B", b);
}

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

int inspectCommand(const std::string& path, bool tensors, std::ostream& out) {
  const std::string dir = findCheckpoint(path);
  if (dir.empty()) {
    out << "no valid checkpoint in " << path << "\n";
    return 2;
  }
  const Manifest m = readManifest(dir);
  out << fmt::format("checkpoint   {}\n", dir);
  out << fmt::format("format       cohort-checkpoint version {}\n", m.formatVersion);
  out << fmt::format("step         {}\n", m.step);
  out << fmt::format("position     epoch {}, batch {} per rank ({} samples of the epoch)\n",
                     m.epoch, m.batchInEpoch, m.samplesInEpoch);
  out << fmt::format("world size   {}\n", m.worldSize);
  out << fmt::format("job hash     {}\n", m.jobHash);
  out << fmt::format("created      {}\n", m.created);
  if (m.extra.contains("lr")) out << fmt::format("lr           {}\n", m.extra["lr"].dump());
  if (m.extra.contains("optimizer")) {
    out << fmt::format("optimizer    {}\n", m.extra["optimizer"].get<std::string>());
  }
  out << "files\n";
  size_t width = 16;  // the names' column (a pipeline's stage<s>-... are longer)
  for (const auto& f : m.files) width = std::max(width, f.name.size());
  for (const auto& f : m.files) {
    std::string what;
    try {
      nlohmann::json meta;
      const auto infos = readTensorFileInfo(dir + "/" + f.name, &meta);
      uint64_t elements = 0;
      for (const auto& t : infos) {
        uint64_t n = 1;
        for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
        elements += n;
      }
      what = fmt::format("{}: {} tensors, {} elements", meta.value("kind", std::string("?")),
                         infos.size(), elements);
      if (tensors) {
        for (const auto& t : infos) {
          what += fmt::format("\n      {} {} [{}]", t.name, t.dtype, fmt::join(t.shape, ", "));
        }
      }
    } catch (const Error& e) {
      what = fmt::format("unreadable: {}", e.what());
    }
    out << fmt::format("  {:<{}} {:>11}  {}  {}\n", f.name, width, humanBytes(f.size), f.checksum, what);
  }
  return 0;
}

}  // namespace cohort::ckpt
