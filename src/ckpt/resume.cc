#include "cohort/ckpt/resume.h"

#include <fmt/format.h>

#include <filesystem>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/tier.h"
#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/storage/storage.h"
#include "cohort/core/time.h"

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

namespace {

// Keys whose change makes a checkpoint's position in the epoch meaningless.
bool positionDependsOn(const std::string& key) {
  return key.rfind("data.train.", 0) == 0 || key == "training.batch_size" ||
         key == "training.accumulate_steps" || key == "training.seed" ||
         key == "data.drop_last" || key == "training.optimizer.name";
}

std::string runName(const RunDir& runDir) { return fs::path(runDir.root).filename().string(); }

}  // namespace

std::string checkpointDir(const JobConfig& job, const RunDir& runDir) {
  if (job.checkpoint.dir.empty()) return runDir.root + "/checkpoints";
  return job.checkpoint.dir + "/" + runName(runDir);
}

std::string remoteCheckpointDir(const JobConfig& job, const RunDir& runDir) {
  if (job.checkpoint.remote.empty()) return "";
  return storage::joinUrl(job.checkpoint.remote, runName(runDir));
}

std::string chooseResumeCheckpoint(const JobConfig& job, const RunDir& runDir,
                                   const std::string& resumeArg) {
  const std::string own = checkpointDir(job, runDir);
  std::vector<std::string> skipped;
  std::optional<ResumePoint> point = newestValidCheckpoint(own, &skipped);
  for (const auto& s : skipped) log::warn("skipping invalid checkpoint {}", s);
  if (!point && !resumeArg.empty()) point = resolveResumePath(resumeArg);
  if (!point && !job.checkpoint.remote.empty()) {
    auto tier = openTier(remoteCheckpointDir(job, runDir), storage::storageOptions(job.storage));
    const auto steps = tier->list();
    if (!steps.empty()) {
      const std::string local = own + "/" + checkpointDirName(steps.back());
      log::info("downloading checkpoint step {} from {}", steps.back(), tier->describe());
      tier->download(steps.back(), local);
      Verification v = verifyCheckpoint(local, true);
      if (!v.valid) throw DataError(fmt::format("downloaded checkpoint is invalid: {}", v.problem));
      point = ResumePoint{local, steps.back(), {}};
    }
  }
  // What the run's own directory holds past the chosen point is written
  // afresh by the resumed run: directories never committed are removed,
  // invalid ones are set aside (step-<N>.invalid-<time>) for inspection.
  const int64_t keepUpTo = point ? point->step : -1;
  for (const auto& d : listCheckpointDirs(own)) {
    if (d.step <= keepUpTo) continue;
    std::error_code ec;
    if (!fs::exists(d.path + "/manifest.json", ec)) {
      fs::remove_all(d.path, ec);
      log::info("removed {} (never committed)", d.path);
      continue;
    }
    const std::string aside = d.path + ".invalid-" + utcNow();
    fs::rename(d.path, aside, ec);
    log::warn("set aside the invalid checkpoint {} as {}", d.path, aside);
  }
  return point ? point->path : std::string();
}

std::vector<std::string> checkResumable(const Manifest& m, const JobConfig& job, int worldSize,
                                        const std::string& path) {
  // Another world size takes the epoch up where the checkpoint's ranks
  // were (train/detail/setup.h, resumePosition), as does another batch
  // size or accumulation when the checkpoint records its own.
  std::vector<std::string> changed;
  if (m.worldSize != worldSize) {
    changed.push_back(fmt::format("world size: {} -> {}", m.worldSize, worldSize));
  }
  if (m.jobHash == jobHash(job)) return changed;
  const bool layoutRecorded = m.extra.contains("batch_size") && m.extra.contains("accumulate");
  const std::string saved = m.extra.value("job", std::string());
  for (const auto& c : diffJobs(saved, job)) {
    const bool layout = c.key == "training.batch_size" || c.key == "training.accumulate_steps";
    if (positionDependsOn(c.key) && !(layout && layoutRecorded)) {
      throw ConfigError(fmt::format(
          "cannot resume from {}: {} changed from {} to {}, and the checkpoint's place in the "
          "epoch depends on it; start a new run (cohort run --new-run) instead",
          path, c.key, c.before, c.after));
    }
    changed.push_back(fmt::format("{}: {} -> {}", c.key, c.before, c.after));
  }
  return changed;
}

}  // namespace cohort::ckpt
