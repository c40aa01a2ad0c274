#include "cohort/core/version.h"

#include <torch/version.h>

namespace cohort {

const char* version() { return COHORT_VERSION; }
const char* torchVersion() { return TORCH_VERSION; }

}  // namespace cohort
