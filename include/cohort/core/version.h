#pragma once

namespace cohort {
// "0.1.0"; set by the build from the CMake project version.
const char* version();
// The LibTorch version cohort was built against, e.g. "1.13.1".
const char* torchVersion();
}  // namespace cohort
