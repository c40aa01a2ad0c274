#include "cohort/comm/wait.h"

#include <atomic>

namespace cohort::comm {
namespace {

std::atomic<WaitObserver*> installed{nullptr};
thread_local int depth = 0;

}  // namespace

void setWaitObserver(WaitObserver* observer) { installed.store(observer, std::memory_order_release); }

CollectiveWait::CollectiveWait(const char* what) {
  if (depth++ != 0) return;
  observer_ = installed.load(std::memory_order_acquire);
  if (observer_) observer_->waitBegins(what);
}

CollectiveWait::~CollectiveWait() {
  --depth;
  if (observer_) observer_->waitEnds();
}

}  // namespace cohort::comm
