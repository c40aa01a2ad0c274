#pragma once

// COHORT_FAULT (core/env.h) as the training loop applies it: a test hook that
// makes one rank fail in a chosen way at a chosen step.

#include <cstdint>
#include <optional>

#include "cohort/core/env.h"

namespace cohort::train::detail {

class FaultPlan {
 public:
  // The fault for this rank's attempt: none after a restart unless the
  // fault says every attempt.
  FaultPlan(int rank, int restartCount);

  // nan: this step's inputs become NaN (a diverging loss on this rank).
  bool poisonInputs(int64_t step) const;
  // slow: this rank's forward takes `amount` ms longer from the step on.
  void delayForward(int64_t step) const;
  // exit, kill, sleep: after optimizer step `step` (counted from 1) the
  // process exits with the code, is killed with SIGKILL, or hangs.
  void afterStep(int64_t step) const;

 private:
  bool is(env::Fault::Action action) const;
  std::optional<env::Fault> fault_;
  int rank_;
};

}  // namespace cohort::train::detail
