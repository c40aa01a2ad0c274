#pragma once

// Heartbeats and the stall inspector. Every rank runs a Watchdog: a thread
// that, every `heartbeatS`, publishes the rank's activity (monitor/
// activity.h: step, phase, the collective it waits in) under hb/<rank> in
// the rendezvous store, and looks at its own wait. When the rank has waited
// in one collective for `warnS`, it logs which ranks are not there and what
// their heartbeats say (step, phase, how long ago), again every `warnS`;
// past `failS` it logs the same as an error and ends the process with
// kExitStalled, so the launcher can restart the job instead of it hanging.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cohort/monitor/heartbeat.h"

namespace cohort::comm {
struct Comm;
}

namespace cohort::monitor {

// Exit code of a rank that gave up on a stalled collective.
inline constexpr int kExitStalled = 4;

struct WatchdogOptions {
  double heartbeatS = 2;  // heartbeat and inspection period
  double warnS = 60;      // a wait this long is reported; 0: never
  double failS = 300;     // a wait this long ends the rank; 0: never
};

class Watchdog {
 public:
  // Opens its own store client (comm::openStoreClient) and starts the
  // thread. With one rank it only heartbeats. Throws CommError when the
  // store cannot be reached.
  Watchdog(const comm::Comm& comm, const WatchdogOptions& options);
  // Stops and joins the thread (within one period).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  struct Impl;
  void loop();
  void beat();
  void inspect();
  std::string describeWait(const std::string& what, int64_t step, double seconds);

  std::unique_ptr<Impl> impl_;
  WatchdogOptions options_;
  int rank_ = 0;
  int world_ = 1;
  std::string host_;
  double reportedUpTo_ = 0;  // the wait's length at its last report
  double lastWaitSeconds_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cohort::monitor
