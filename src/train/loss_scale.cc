#include "cohort/train/loss_scale.h"

#include <algorithm>

namespace cohort::train {

LossScaler::LossScaler(const LossScaleConfig& config)
    : config_(config), scale_(std::clamp(config.init, config.minScale, config.maxScale)) {}

bool LossScaler::update(bool gradientsFinite) {
  if (!gradientsFinite) {
    ++skipped_;
    ++skippedInARow_;
    goodSteps_ = 0;
    scale_ = std::max(scale_ * config_.backoffFactor, config_.minScale);
    return false;
  }
  skippedInARow_ = 0;
  if (++goodSteps_ >= config_.growthInterval) {
    scale_ = std::min(scale_ * config_.growthFactor, config_.maxScale);
    goodSteps_ = 0;
  }
  return true;
}

void LossScaler::restore(const State& state) {
  scale_ = std::clamp(state.scale, config_.minScale, config_.maxScale);
  goodSteps_ = std::max<int64_t>(0, state.goodSteps);
}

bool lossScalingOn(const LossScaleConfig& config, Precision precision) {
  switch (config.enabled) {
    case LossScaling::on: return true;
    case LossScaling::off: return false;
    case LossScaling::automatic: break;
  }
  return precision == Precision::fp16;
}

}  // namespace cohort::train
