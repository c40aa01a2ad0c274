#pragma once

// Debian's python3 (COHORT_PYTHON) for the side-by-side tests against
// PyTorch and torchvision. scripts/install-deps.sh installs python3-torch and
// python3-torchvision, so a module that does not import fails the test: a
// skip would hide a broken install.

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "util/process.h"

namespace cohort::test {

// Success when `python -c "import <modules>"` works; otherwise a failure
// naming the interpreter, the modules and its error.
inline ::testing::AssertionResult pythonImports(const std::string& modules) {
  const ProcessResult r = run({COHORT_PYTHON, "-c", "import " + modules}, {}, std::chrono::minutes(2));
  if (r.exitCode == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << COHORT_PYTHON << " cannot import " << modules
         << " (scripts/install-deps.sh installs python3-torch and python3-torchvision): " << r.err;
}

}  // namespace cohort::test
