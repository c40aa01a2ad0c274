#pragma once

// Skipping a test that needs what this machine may lack (root, network
// namespaces, cgroup limits, etcd, Slurm). Where everything is there by
// design, as in CI (.ci/run sets COHORT_TEST_NO_SKIP=1), such a skip would
// hide a test that never ran: it fails instead, with the same reason.

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace cohort::test {

inline bool skipsFail() {
  const char* v = std::getenv("COHORT_TEST_NO_SKIP");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace cohort::test

// Skips the current test with `why` (a string), or fails it under
// COHORT_TEST_NO_SKIP=1. Returns from the calling function, as GTEST_SKIP
// does.
#define COHORT_SKIP(why)                                                                     \
  do {                                                                                       \
    const std::string cohort_skip_why_ = (why);                                              \
    if (::cohort::test::skipsFail()) {                                                       \
      FAIL() << "this test would skip, and COHORT_TEST_NO_SKIP=1 forbids it: " << cohort_skip_why_; \
    }                                                                                        \
    GTEST_SKIP() << cohort_skip_why_;                                                        \
  } while (0)
