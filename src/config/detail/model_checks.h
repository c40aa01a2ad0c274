#pragma once

// validate()'s checks of the model (config/parse.cc): its sizes and the
// keys that belong to one architecture, and the model against
// distribution.pipeline and distribution.tensor (docs/parallelism.md).
// Each throws ConfigError naming the key's place in the job file.

#include <functional>
#include <string>

#include "cohort/config/job.h"

namespace cohort::detail {

// A key's place in the job file ("job.yaml:12:5", or the file).
using Where = std::function<std::string(const std::string& path)>;

// Throws ConfigError "where: path: msg".
[[noreturn]] void fail(const std::string& where, const std::string& path, const std::string& msg);

void checkTensor(const JobConfig& job, const Where& where);
void checkPipeline(const JobConfig& job, const Where& where);
// Heads dividing the width, llama's and bert's own keys set only for them.
void checkModelSizes(const JobConfig& job, const Where& where);

}  // namespace cohort::detail
