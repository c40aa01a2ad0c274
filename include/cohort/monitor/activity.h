#pragma once

// What this rank is doing right now: its step, its phase, and the collective
// it waits in, if any. The training loop sets the step and phase (relaxed
// atomic stores, no lock); the collective comes from comm, observed through
// comm's WaitObserver (comm/wait.h) once observeCollectives() installed it.
// The watchdog's thread reads it for the heartbeat the other ranks see and
// for the stall inspector.

#include <cstdint>
#include <string>

namespace cohort::monitor {

enum class Phase : int {
  starting,    // before the first step: loading data, building the model
  data,        // waiting for the next batch
  forward,
  backward,
  exchange,    // finishing the gradient exchange
  optimizer,
  checkpoint,
  evaluation,
  finishing,   // after training: summaries, the final save
};

const char* phaseName(Phase p);

void setStep(int64_t step);
void setPhase(Phase p);

// From now on, the collective this process waits in (comm::CollectiveWait)
// is part of activity(). The Watchdog calls it; calling it again is harmless.
void observeCollectives();

struct Activity {
  int64_t step = 0;
  Phase phase = Phase::starting;
  double phaseSeconds = 0;  // since the phase began
  std::string waitingIn;    // the collective waited in; empty: none
  double waitingSeconds = 0;
};

// A consistent-enough snapshot (each field is read atomically).
Activity activity();

}  // namespace cohort::monitor
