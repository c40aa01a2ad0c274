#pragma once

// Choosing the checkpoint a run resumes from.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cohort::ckpt {

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

}  // namespace cohort::ckpt
