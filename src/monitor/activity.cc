#include "cohort/monitor/activity.h"

#include <atomic>
#include <chrono>

#include "cohort/comm/wait.h"

namespace cohort::monitor {
namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct State {
  std::atomic<int64_t> step{0};
  std::atomic<int> phase{static_cast<int>(Phase::starting)};
  std::atomic<int64_t> phaseSince{nowNs()};
  std::atomic<const char*> waitingIn{nullptr};
  std::atomic<int64_t> waitingSince{0};
};

State& state() {
  static State s;
  return s;
}

// comm::CollectiveWait tells it of each outermost wait.
class CollectiveObserver : public comm::WaitObserver {
 public:
  void waitBegins(const char* what) override {
    State& s = state();
    s.waitingSince.store(nowNs(), std::memory_order_relaxed);
    s.waitingIn.store(what, std::memory_order_release);
  }
  void waitEnds() override { state().waitingIn.store(nullptr, std::memory_order_release); }
};

}  // namespace

const char* phaseName(Phase p) {
  switch (p) {
    case Phase::starting: return "starting";
    case Phase::data: return "data";
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::exchange: return "exchange";
    case Phase::optimizer: return "optimizer";
    case Phase::checkpoint: return "checkpoint";
    case Phase::evaluation: return "evaluation";
    case Phase::finishing: return "finishing";
  }
  return "?";
}

void setStep(int64_t step) { state().step.store(step, std::memory_order_relaxed); }

void setPhase(Phase p) {
  State& s = state();
  if (s.phase.load(std::memory_order_relaxed) == static_cast<int>(p)) return;
  s.phaseSince.store(nowNs(), std::memory_order_relaxed);
  s.phase.store(static_cast<int>(p), std::memory_order_relaxed);
}

void observeCollectives() {
  static CollectiveObserver observer;
  comm::setWaitObserver(&observer);
}

Activity activity() {
  const State& s = state();
  const int64_t now = nowNs();
  Activity a;
  a.step = s.step.load(std::memory_order_relaxed);
  a.phase = static_cast<Phase>(s.phase.load(std::memory_order_relaxed));
  a.phaseSeconds = double(now - s.phaseSince.load(std::memory_order_relaxed)) * 1e-9;
  if (const char* w = s.waitingIn.load(std::memory_order_acquire)) {
    a.waitingIn = w;
    a.waitingSeconds = double(now - s.waitingSince.load(std::memory_order_relaxed)) * 1e-9;
  }
  return a;
}

}  // namespace cohort::monitor
