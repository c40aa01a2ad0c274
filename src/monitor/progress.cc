#include "cohort/monitor/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cohort/core/log.h"

namespace cohort::monitor {

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

Progress::Progress(ProgressMode mode, int64_t epochs) : mode_(mode), epochs_(epochs) {}

void Progress::startEpoch(int64_t epoch, int64_t steps) {
  epoch_ = epoch;
  steps_ = std::max<int64_t>(1, steps);
  start_ = std::chrono::steady_clock::now();
  lastDraw_ = {};
  if (mode_ == ProgressMode::bar) log::setStatusLine(line(0, NAN, NAN, true));
}

std::string Progress::line(int64_t step, double loss, double imagesPerS, bool bar, double mfu) const {
  const double frac = std::clamp(static_cast<double>(step) / static_cast<double>(steps_), 0.0, 1.0);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = step > 0 ? elapsed / static_cast<double>(step) * static_cast<double>(steps_ - step) : NAN;
  std::string out = fmt::format("epoch {}/{} ", epoch_, epochs_);
  if (bar) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(frac * kWidth);
    std::string b(static_cast<size_t>(kWidth), ' ');
    for (int i = 0; i < filled; ++i) b[static_cast<size_t>(i)] = '=';
    if (filled < kWidth && step > 0) b[static_cast<size_t>(filled)] = '>';
    out += fmt::format("[{}] {:3.0f}% {}/{}", b, frac * 100, step, steps_);
  } else {
    out += fmt::format("step {}/{} ({:.0f}%)", step, steps_, frac * 100);
  }
  if (std::isfinite(loss)) out += fmt::format(" loss {:.4f}", loss);
  if (std::isfinite(imagesPerS)) out += fmt::format(" {:.0f} img/s", imagesPerS);
  if (std::isfinite(mfu)) out += fmt::format(" MFU {:.0f}%", 100 * mfu);
  out += " ETA " + formatDuration(eta);
  return out;
}

void Progress::update(int64_t step, double loss, double imagesPerS, bool milestone, double mfu) {
  if (mode_ == ProgressMode::off) return;
  if (mode_ == ProgressMode::plain) {
    if (milestone) log::info("{}", line(step, loss, imagesPerS, false, mfu));
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (step < steps_ && now - lastDraw_ < std::chrono::milliseconds(100)) return;
  lastDraw_ = now;
  log::setStatusLine(line(step, loss, imagesPerS, true, mfu));
}

void Progress::endEpoch() {
  if (mode_ == ProgressMode::bar) log::setStatusLine("");
}

}  // namespace cohort::monitor
