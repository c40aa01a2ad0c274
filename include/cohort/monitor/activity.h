#pragma once

// What this rank is doing right now: its step, its phase, and the collective
// it waits in, if any. The training loop and the collectives set it (a few
// relaxed atomic stores, no lock); the watchdog's thread reads it for the
// heartbeat the other ranks see and for the stall inspector.

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

// Marks the calling thread as waiting in a collective named `what` (a string
// literal: only the pointer is kept) for its lifetime. Nested scopes keep the
// outermost one.
class WaitScope {
 public:
  explicit WaitScope(const char* what);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  bool outermost_;
};

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
