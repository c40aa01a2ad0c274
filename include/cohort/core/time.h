#pragma once

// Wall-clock time as records, heartbeats and event files store it.

#include <chrono>

namespace cohort {

// Seconds since the Unix epoch, with sub-second precision.
inline double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace cohort
