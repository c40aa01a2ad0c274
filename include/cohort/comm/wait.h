#pragma once

// Waiting in a collective, for whoever wants to know. comm and ddp mark each
// blocking collective with a CollectiveWait; an observer that someone
// installed (the stall inspector: monitor::observeCollectives) hears of the
// outermost one on each thread. comm knows nothing of its observers. Without
// one, a wait costs a thread-local increment and one atomic load.

namespace cohort::comm {

class WaitObserver {
 public:
  virtual ~WaitObserver() = default;
  // The calling thread starts waiting in the collective `what` (a string
  // literal: only the pointer may be kept).
  virtual void waitBegins(const char* what) = 0;
  // It stopped waiting.
  virtual void waitEnds() = 0;
};

// Installs the process-wide observer (nullptr: none). It must live as long as
// the process may wait.
void setWaitObserver(WaitObserver* observer);

// Marks the calling thread as waiting in `what` for its lifetime. Nested
// waits report the outermost only.
class CollectiveWait {
 public:
  explicit CollectiveWait(const char* what);
  ~CollectiveWait();
  CollectiveWait(const CollectiveWait&) = delete;
  CollectiveWait& operator=(const CollectiveWait&) = delete;

 private:
  WaitObserver* observer_ = nullptr;  // told of this wait (outermost only)
};

// Abandoning every collective of this process, for good: an elastic rank
// whose round broke elsewhere (docs/elastic.md). Shuts down the process's
// TCP connections, so that Gloo's blocked reads and writes fail at once
// instead of at the collective timeout, and makes the shared-memory
// exchange's waits throw CommError. Async-signal-safe enough for a signal
// thread (no allocation after the first call). The process exits soon after.
void abandonCollectives();
bool collectivesAbandoned();

}  // namespace cohort::comm
