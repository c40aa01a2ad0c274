#pragma once

// Time: wall-clock as records, heartbeats and event files store it, and the
// monotonic clock that durations are measured with.

#include <chrono>
#include <ctime>
#include <string>

namespace cohort {

// Seconds since the Unix epoch, with sub-second precision.
inline double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// `t` in UTC, as strftime's `format` writes it.
std::string formatUtc(std::time_t t, const char* format);

// Now in UTC as ISO 8601 ("2026-11-21T22:31:18Z"): manifests, events, records.
std::string utcNow();

// The clock of every measured duration (phases, blocking, waits).
using SteadyClock = std::chrono::steady_clock;

// Seconds from `from` to `to`.
inline double secondsBetween(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Seconds from `t` to now.
inline double secondsSince(SteadyClock::time_point t) {
  return secondsBetween(t, SteadyClock::now());
}

}  // namespace cohort
