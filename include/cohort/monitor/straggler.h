#pragma once

// Stragglers: in synchronous training every rank waits for the slowest, so
// step times are equal and say nothing; the time each rank spends computing
// (forward and backward, without waits) tells which one holds the others up.

#include <string>
#include <vector>

namespace cohort::monitor {

struct Straggler {
  int rank = 0;
  double ms = 0;        // its compute time per step
  double medianMs = 0;  // the median of the other ranks'
};

// The ranks whose compute time per step (`msPerStep`, indexed by rank) is
// more than `factor` times the median of the other ranks', and at least
// kMinStragglerGapMs more (below that, scheduling noise on tiny steps would
// be reported). None with fewer than two ranks or a factor <= 0.
inline constexpr double kMinStragglerGapMs = 10;
std::vector<Straggler> findStragglers(const std::vector<double>& msPerStep, double factor);

// "rank 1: 310 ms of compute per step, 2.1x the median of the others (150 ms)".
std::string describe(const Straggler& s);

}  // namespace cohort::monitor
