#pragma once

// Resume policy: where a run's checkpoints live, which one it resumes from,
// and whether this job can continue it exactly. What a resumed rank restores
// is in ckpt/rank_state.h (its own state) and the files named there.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"

namespace cohort::ckpt {

struct Manifest;

struct ResumePoint {
  std::string path;   // the step-<N> directory
  int64_t step = 0;
  std::vector<std::string> skipped;  // newer checkpoints that failed verification, with why
};

// The newest checkpoint under `dir` whose manifest and file checksums verify.
// Newer ones that do not are listed in `skipped` (nullopt and the list when
// none verifies). Directories without a manifest (checkpoints never
// committed) are passed over silently.
std::optional<ResumePoint> newestValidCheckpoint(const std::string& dir,
                                                 std::vector<std::string>* skipped = nullptr);

// What `--resume PATH` names: a checkpoint directory (it must verify), a
// directory of step-<N> directories, or a run directory (its checkpoints/).
// Throws DataError naming PATH when it holds no valid checkpoint.
ResumePoint resolveResumePath(const std::string& path);

// Where the run's checkpoints go: <run dir>/checkpoints, or, when
// checkpoint.dir is set, <checkpoint.dir>/<run directory's name> (each run
// its own; another run's checkpoints are reached with --resume).
std::string checkpointDir(const JobConfig& job, const RunDir& runDir);
// The run's directory on the remote tier: <checkpoint.remote>/<run name>, or
// "" without one.
std::string remoteCheckpointDir(const JobConfig& job, const RunDir& runDir);

// Rank 0 before training: the checkpoint this run resumes from. The newest
// valid one in the run's own checkpoint directory; if there is none,
// `resumeArg` (--resume: a checkpoint, checkpoints or run directory); if that
// is empty too, the newest on the remote tier (downloaded). Logs every newer
// checkpoint skipped as invalid, and sets aside the run's own checkpoint
// directories newer than the one chosen (never committed: removed; invalid:
// renamed step-<N>.invalid-<time>). Returns "" to start fresh.
std::string chooseResumeCheckpoint(const JobConfig& job, const RunDir& runDir,
                                   const std::string& resumeArg);

// Whether `job` on `worldSize` ranks can continue the checkpoint at `path`
// (its manifest `m`) exactly. Throws ConfigError naming the checkpoint when
// a setting the order of the epoch depends on changed (data.train.*, seed,
// drop_last, the optimizer; batch size and accumulation too for a
// checkpoint that does not record its own, written before they could
// change). Another world size is fine: the epoch goes on from the
// position the checkpoint's ranks reached together. Returns the safe
// changes ("key: before -> after": the world size, more epochs, another
// learning rate, ...), for the caller to report.
std::vector<std::string> checkResumable(const Manifest& m, const JobConfig& job, int worldSize,
                                        const std::string& path);

}  // namespace cohort::ckpt
