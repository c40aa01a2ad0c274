#include "train/detail/faults.h"

#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <cstdlib>
#include <thread>

#include "cohort/core/error.h"
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

void FaultPlan::failCollective(int64_t step) const {
  if (!is(A::commFail) || step != fault_->step) return;
  log::warn("COHORT_FAULT: the last collective of step {} fails on this rank", step);
  throw CommError(fmt::format("rank {}: COHORT_FAULT: step {}'s last collective failed on this rank", rank_, step));
}

void FaultPlan::afterStep(int64_t step) const {
  if (!fault_ || fault_->rank != rank_ || fault_->step != step) return;
  // In the step itself.
  if (fault_->action == A::slow || fault_->action == A::nan || fault_->action == A::commFail) return;
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
  if (fault_->action == A::segv) {
    log::warn("COHORT_FAULT: SIGSEGV to this rank after step {}", step);
    log::flush();
    ::raise(SIGSEGV);
  }
  if (fault_->action == A::throwError) {
    throw Error(fmt::format("COHORT_FAULT: an error thrown after step {}", step));
  }
  log::warn("COHORT_FAULT: exiting with code {} after step {}", fault_->exitCode, step);
  log::flush();
  std::_Exit(fault_->exitCode);
}

SampleLog::SampleLog(int round, bool logs) : round_(round) {
  if (auto dir = logs ? env::sampleLogDir() : std::nullopt; dir) path_ = fmt::format("{}/samples-{}.txt", *dir, ::getpid());
}

void SampleLog::startEpoch(std::vector<int64_t> order, int64_t batchSize) {
  order_ = std::move(order);
  batchSize_ = batchSize;
}

namespace {
int64_t unixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void SampleLog::stepDone(int64_t step) {
  std::ofstream out(path_, std::ios::app);
  out << round_ << ' ' << step << " -1 " << unixMs() << '\n';
}

void SampleLog::microBatch(int64_t step, int64_t epoch, int64_t index, int64_t count) {
  std::ofstream out(path_, std::ios::app);
  out << round_ << ' ' << step << ' ' << epoch << ' ' << unixMs();
  const auto size = static_cast<int64_t>(order_.size());
  for (int64_t i = index * batchSize_; i < std::min(size, index * batchSize_ + count); ++i) {
    out << ' ' << order_[static_cast<size_t>(i)];
  }
  out << '\n';
}

}  // namespace cohort::train::detail
