#pragma once

// A rank's heartbeat in the rendezvous store: what its watchdog publishes
// (monitor/watchdog.h) and what the launcher's /metrics reads
// (run/run_metrics.h). No LibTorch, so that the launcher needs none.

#include <cstdint>
#include <string>

namespace cohort::monitor {

// A rank's heartbeat as the store holds it (JSON).
struct Heartbeat {
  int rank = 0;
  int64_t step = 0;
  std::string phase;
  double phaseSeconds = 0;
  std::string waitingIn;  // empty: not in a collective
  double waitingSeconds = 0;
  double unixTime = 0;    // when it was written
  std::string host;
  int pid = 0;
};

std::string encodeHeartbeat(const Heartbeat& h);
// Throws DataError on a malformed value.
Heartbeat decodeHeartbeat(const std::string& json);

// The store key of `rank`'s heartbeat, below the run's prefix.
std::string heartbeatKey(int rank);

}  // namespace cohort::monitor
