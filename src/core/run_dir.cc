#include "cohort/core/run_dir.h"

#include <fmt/format.h>

#include <ctime>
#include <filesystem>

#include "cohort/core/error.h"
#include "cohort/core/time.h"

namespace fs = std::filesystem;

namespace cohort {
namespace {

void makeDirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw IoError(fmt::format("cannot create directory {}: {}", path, ec.message()));
}

}  // namespace

std::string RunDir::finalWeights() const {
  std::error_code ec;
  if (!fs::is_regular_file(finalSafetensors(), ec)) return finalModel();
  if (!fs::is_regular_file(finalModel(), ec)) return finalSafetensors();
  // Both: the run wrote one, an earlier run in this directory the other.
  return fs::last_write_time(finalSafetensors(), ec) >= fs::last_write_time(finalModel(), ec) ? finalSafetensors()
                                                                                                : finalModel();
}

RunDir openRunDir(const std::string& path) {
  RunDir d{fs::absolute(path).lexically_normal().string()};
  while (d.root.size() > 1 && d.root.back() == '/') d.root.pop_back();
  makeDirs(d.root);
  makeDirs(d.logsDir());
  makeDirs(d.modelDir());
  return d;
}

std::string createStampedDir(const std::string& outputDir, const std::string& prefix) {
  const std::string stamp = formatUtc(std::time(nullptr), "%Y%m%dT%H%M%SZ");
  makeDirs(outputDir);
  const std::string base = fmt::format("{}/{}-{}", outputDir, prefix, stamp);
  for (int k = 1; k < 1000; ++k) {
    const std::string candidate = k == 1 ? base : fmt::format("{}-{}", base, k);
    std::error_code ec;
    // create_directory returns false when it exists: try the next suffix.
    if (fs::create_directory(candidate, ec)) return fs::absolute(candidate).lexically_normal().string();
    if (ec) throw IoError(fmt::format("cannot create directory {}: {}", candidate, ec.message()));
  }
  throw IoError(fmt::format("cannot create a directory {}-... under {}", prefix, outputDir));
}

RunDir createDefaultRunDir(const std::string& outputDir, const std::string& jobName) {
  return openRunDir(createStampedDir(outputDir, jobName));
}

}  // namespace cohort
