#pragma once

#include <string>
#include <vector>

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
  // commfail: throws CommError where step `step` (counted from 1) has run
  // its last collective and not yet changed any state.
  void failCollective(int64_t step) const;
  // exit, kill, sleep: after optimizer step `step` (counted from 1) the
  // process exits with the code, is killed with SIGKILL, or hangs.
  void afterStep(int64_t step) const;

 private:
  bool is(env::Fault::Action action) const;
  std::optional<env::Fault> fault_;
  int rank_;
};

// COHORT_TEST_SAMPLE_LOG (core/env.h): a test hook recording which samples
// each optimizer step trains on, so a test can check that every sample of
// an epoch is trained on exactly once across restarts and resizes. A line
// per micro-batch, written before its forward (so before any of its
// gradients can leave the rank): "<round> <step> <epoch> <unix time, ms>
// <sample id>..."; and once the step is applied, "<round> <step> -1 <unix
// time, ms>". A step's samples count when the next round (if any) started
// after it; a step applied in a round and done again in the next was lost.
class SampleLog {
 public:
  // `logs`: this rank writes the log (a replica's first rank; the others of
  // the replica train on the same samples).
  SampleLog(int round, bool logs);
  bool enabled() const { return !path_.empty(); }
  // The epoch's order on this rank (DistributedSampler::indices).
  void startEpoch(std::vector<int64_t> order, int64_t batchSize);
  // Micro-batch `index` of the epoch (`count` samples) goes into optimizer
  // step `step` (counted from 1).
  void microBatch(int64_t step, int64_t epoch, int64_t index, int64_t count);
  // Step `step` was applied on this rank.
  void stepDone(int64_t step);

 private:
  std::string path_;
  int round_;
  std::vector<int64_t> order_;
  int64_t batchSize_ = 0;
};

}  // namespace cohort::train::detail
