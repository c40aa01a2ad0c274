#pragma once

// Per-epoch progress on rank 0's console: an in-place bar on a terminal,
// plain log lines otherwise.
//
//   epoch 3/10 [=========>          ]  45% 210/468 loss 0.3121 2450 img/s MFU 41% ETA 0:12

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

namespace cohort::monitor {

// A bar needs a terminal; the trainer falls back to plain without one.
enum class ProgressMode { bar, plain, off };

// "1:02:03" or "2:03".
std::string formatDuration(double seconds);

class Progress {
 public:
  Progress(ProgressMode mode, int64_t epochs);
  void startEpoch(int64_t epoch, int64_t steps);
  // After optimizer step `step` (1-based within the epoch). A plain line is
  // printed when `milestone` (the metrics cadence) is set. `mfu`: model
  // FLOPs utilization per rank (NaN: not shown).
  void update(int64_t step, double loss, double imagesPerS, bool milestone, double mfu = NAN);
  // Clears the bar; the caller logs the epoch's summary line.
  void endEpoch();

 private:
  std::string line(int64_t step, double loss, double imagesPerS, bool bar, double mfu = NAN) const;

  ProgressMode mode_;
  int64_t epochs_;
  int64_t epoch_ = 0;
  int64_t steps_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point lastDraw_;
};

}  // namespace cohort::monitor
