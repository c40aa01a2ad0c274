// Job files and --set overrides (src/config/parse.cc).
//
// Input: the YAML text, then optionally a NUL byte and NUL-separated --set
// overrides ("key.path=value"). A job that loads must also survive the
// round trip through toYaml with the same job hash (load.h promises it).

#include <string>
#include <vector>

#include "cohort/config/load.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  const std::string input = fuzz::asString(data, size);
  const size_t nul = input.find('\0');
  const std::string yaml = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) overrides = fuzz::split(input.substr(nul + 1), '\0');

  JobConfig job;
  // A failing --set names the option instead of the file.
  const std::string origin = overrides.empty() ? "fuzz-job.yaml" : "";
  if (!fuzz::expectInputError(origin, [&] { job = loadJobFromString(yaml, "fuzz-job.yaml", overrides); })) {
    return 0;
  }
  const std::string resolved = toYaml(job);
  JobConfig again;
  std::string error;
  fuzz::require(fuzz::expectInputError("resolved.yaml",
                                       [&] { again = loadJobFromString(resolved, "resolved.yaml"); },
                                       &error),
                "the resolved job does not load again: " + error + "\n" + resolved);
  fuzz::require(jobHash(again) == jobHash(job),
                "the resolved job loads as another job (hash differs):\n" + resolved);
  return 0;
}
