#pragma once

// A request to stop, from a signal (SIGTERM: a preemption notice; SIGUSR2:
// Slurm's time-limit warning). The rank's signal thread records it; the
// training loop, once it can save its state (`graceful`), finishes the step,
// checkpoints and stops; after training it changes nothing (the rank is
// finishing anyway). A request that comes while the rank starts (its
// signals are blocked from the first instruction, core/signals.h) waits:
// training stops after its first steps with a checkpoint. With checkpoints
// off (`abrupt`), SIGTERM ends the process at once, as SIGINT always does.

#include <atomic>
#include <mutex>

namespace cohort::train {

// Under `cohort agent` (docs/elastic.md), SIGUSR2 from the agent asks for a
// re-form: the ranks stop at an agreed step boundary as for SIGTERM, but
// keep their state in the node's memory (elastic.state_dir) instead of a
// checkpoint on disk, and exit kExitStateHeld; the agent then starts them
// again at the new size. SIGTERM from the agent is the stop after a
// checkpoint, as without an agent.
struct StopRequest {
  std::atomic<int> signal{0};        // the signal received, 0: none
  std::atomic<bool> graceful{false}; // the training loop will stop at a step boundary
  std::atomic<bool> reform{false};   // the stop is for a re-form (SIGUSR2 from the agent)
  // Guards the move out of start-up: `graceful` or `abrupt` (checkpoints
  // off) is decided once, and a signal taken meanwhile is seen by the side
  // that decides.
  std::mutex mutex;
  bool abrupt = false;  // checkpoints are off: SIGTERM ends the rank at once
};

// The process-wide request.
inline StopRequest& stopRequest() {
  static StopRequest r;
  return r;
}

}  // namespace cohort::train
