#include "cohort/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace cohort::train {

double peakLearningRate(const OptimizerConfig& config, int64_t globalBatch) {
  if (config.baseBatch <= 0) return config.lr;
  return config.lr * static_cast<double>(globalBatch) / static_cast<double>(config.baseBatch);
}

LrSchedule::LrSchedule(const ScheduleConfig& config, double peakLr, int64_t stepsPerEpoch,
                       int64_t totalSteps)
    : config_(config),
      peak_(peakLr),
      stepsPerEpoch_(std::max<int64_t>(1, stepsPerEpoch)),
      totalSteps_(std::max<int64_t>(1, totalSteps)) {
  warmupSteps_ = static_cast<int64_t>(std::llround(config.warmupEpochs * stepsPerEpoch_));
  warmupSteps_ = std::min(warmupSteps_, totalSteps_);
}

void LrSchedule::anchor(int64_t step, double epochsDone) {
  const int64_t virtualStep =
      static_cast<int64_t>(std::llround(epochsDone * static_cast<double>(stepsPerEpoch_)));
  totalSteps_ = std::max<int64_t>(1, totalSteps_ + virtualStep - step - offset_);
  offset_ = virtualStep - step;
  warmupSteps_ = std::min(
      static_cast<int64_t>(std::llround(config_.warmupEpochs * static_cast<double>(stepsPerEpoch_))),
      totalSteps_);
}

double LrSchedule::at(int64_t runStep) const {
  const int64_t step = runStep + offset_;
  if (step < warmupSteps_) {
    return peak_ * static_cast<double>(step + 1) / static_cast<double>(warmupSteps_);
  }
  if (config_.name == ScheduleKind::cosine) {
    // The last step (totalSteps_ - 1) trains at exactly min_lr.
    const double span = static_cast<double>(std::max<int64_t>(1, totalSteps_ - warmupSteps_ - 1));
    const double progress = std::clamp(static_cast<double>(step - warmupSteps_) / span, 0.0, 1.0);
    return config_.minLr + (peak_ - config_.minLr) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  if (config_.name == ScheduleKind::step) {
    const double epoch = static_cast<double>(step) / static_cast<double>(stepsPerEpoch_);
    double lr = peak_;
    for (double m : config_.milestones) {
      if (epoch >= m) lr *= config_.gamma;
    }
    return lr;
  }
  return peak_;
}

}  // namespace cohort::train
