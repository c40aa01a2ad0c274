#include "cohort/train/state_memory.h"

namespace cohort::train {

double optimizerCopies(const OptimizerConfig& optimizer) {
  return optimizer.name == OptimizerKind::adamw ? 2 : optimizer.momentum != 0 ? 1 : 0;
}

StateBytes stateBytes(const ModelElements& m, int stage, int world, const OptimizerConfig& optimizer,
                      double bucketCapMb, bool byUnit) {
  // Frozen weights are held whole on every rank, except at stage 3 by a
  // model built unit by unit, which holds them in parts.
  const bool frozenInParts = byUnit && stage == 3;
  const double fixed = m.buffers + (frozenInParts ? 0 : m.frozen);
  const double frozen = frozenInParts ? m.frozen : 0;
  const double elements = m.trainable;
  const double copies = optimizerCopies(optimizer);
  const double n = std::max(1, world);
  const bool shardedGradients = stage >= 2 && world > 1;
  StateBytes b;
  b.parameters = 4 * fixed + 4 * (elements + frozen) / (stage == 3 ? n : 1);
  b.gradients = 4 * elements / (shardedGradients ? n : 1);
  b.optimizer = 4 * copies * elements / (stage > 0 ? n : 1);
  b.fixed = 4 * fixed;
  b.shardable = 4 * elements * (2 + copies) + 4 * frozen;
  b.stage3Unit = 4 * (frozenInParts ? m.unitWithFrozen : m.unit);
  if (stage == 3) {
    // A unit's parameters and gradients are whole while it runs.
    b.unit = b.stage3Unit;
  } else if (shardedGradients) {
    // Stage 2: a bucket filling while the one before is exchanged.
    b.unit = 2 * std::min(bucketCapMb * (1 << 20), 4 * elements);
  }
  // Every rank builds the model whole before it is cut into parts, unless
  // it builds it unit by unit (parts and one unit: less than training holds).
  b.wholeModel = byUnit ? 0 : 4 * (fixed + elements + frozen);
  return b;
}

}  // namespace cohort::train
