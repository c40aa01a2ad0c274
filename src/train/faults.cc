#include "train/detail/faults.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "cohort/core/log.h"

namespace cohort::train::detail {

using A = env::Fault::Action;

FaultPlan::FaultPlan(int rank, int restartCount) : fault_(env::fault()), rank_(rank) {
  if (fault_ && !fault_->everyAttempt && restartCount > 0) fault_.reset();
}

bool FaultPlan::is(A action) const {
  return fault_ && fault_->rank == rank_ && fault_->action == action;
}

bool FaultPlan::poisonInputs(int64_t step) const { return is(A::nan) && step == fault_->step; }

void FaultPlan::delayForward(int64_t step) const {
  if (is(A::slow) && step >= fault_->step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(fault_->amount));
  }
}

void FaultPlan::afterStep(int64_t step) const {
  if (!fault_ || fault_->rank != rank_ || fault_->step != step) return;
  if (fault_->action == A::slow || fault_->action == A::nan) return;  // in the step itself
  if (fault_->action == A::sleep) {
    log::warn("COHORT_FAULT: hanging for {} s after step {}", fault_->amount, step);
    std::this_thread::sleep_for(std::chrono::seconds(fault_->amount));
    return;
  }
  if (fault_->action == A::kill) {
    log::warn("COHORT_FAULT: killing this rank with SIGKILL after step {}", step);
    log::flush();
    ::kill(::getpid(), SIGKILL);
  }
  log::warn("COHORT_FAULT: exiting with code {} after step {}", fault_->exitCode, step);
  log::flush();
  std::_Exit(fault_->exitCode);
}

}  // namespace cohort::train::detail
