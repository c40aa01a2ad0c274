#pragma once

// Stopping on request (SIGTERM, a preemption notice) at a step boundary
// every rank agrees on. The first rank to see the request publishes "stop
// after step s+1" in the store (s: its steps done); no rank can finish step
// s+1 before that, as that step's gradients need every rank. Only with
// checkpoints on: the stop happens after a checkpoint, so nothing is lost.

#include <cstdint>
#include <optional>

#include "cohort/comm/comm.h"

namespace cohort::train::detail {

class StopProtocol {
 public:
  // `enabled`: checkpoints are on; marks the process's stopRequest()
  // graceful, so that SIGTERM no longer ends the rank at once.
  StopProtocol(const comm::Comm& comm, bool enabled);

  // After `step` optimizer steps: whether training stops now. Every rank
  // calls it after every step.
  bool due(int64_t step);
  // Once due: the stop is for a re-form (StopRequest::reform of the rank
  // that asked first): the state goes to memory, not to a checkpoint.
  bool reform() const { return reform_; }

 private:
  const comm::Comm& comm_;
  bool enabled_;
  bool published_ = false;
  std::optional<int64_t> stopAt_;
  bool reform_ = false;
};

}  // namespace cohort::train::detail
