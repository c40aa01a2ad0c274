#include "train/detail/memory_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "cohort/core/error.h"

namespace cohort::train::detail {

namespace {

std::string mb(double bytes) { return fmt::format("{:.0f} MB", bytes / (1 << 20)); }
std::string ranks(int n) { return fmt::format("{} rank{}", n, n == 1 ? "" : "s"); }

}  // namespace

StateBytes stateBytes(const torch::nn::Module& model, int stage, int world,
                      const std::vector<std::string>& units, const OptimizerConfig& optimizer,
                      double bucketCapMb) {
  std::set<const void*> seen;
  std::map<std::string, double> unitElements;  // "" for the parameters outside every unit
  double elements = 0, fixed = 0;  // trainable; frozen weights and buffers (whole on every rank)
  for (const auto& p : model.named_parameters()) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    const double n = static_cast<double>(p.value().numel());
    if (!p.value().requires_grad()) {
      fixed += n;
      continue;
    }
    elements += n;
    std::string unit;
    for (const std::string& u : units) {
      if (p.key().rfind(u + ".", 0) == 0) {
        unit = u;
        break;
      }
    }
    unitElements[unit] += n;
  }
  for (const auto& b : model.buffers()) {
    if (b.is_floating_point() && seen.insert(b.unsafeGetTensorImpl()).second) fixed += static_cast<double>(b.numel());
  }
  const double copies = optimizer.name == OptimizerKind::adamw ? 2 : optimizer.momentum != 0 ? 1 : 0;
  const double n = std::max(1, world);
  const bool shardedGradients = stage >= 2 && world > 1;
  StateBytes b;
  b.parameters = 4 * fixed + 4 * elements / (stage == 3 ? n : 1);
  b.gradients = 4 * elements / (shardedGradients ? n : 1);
  b.optimizer = 4 * copies * elements / (stage > 0 ? n : 1);
  if (stage == 3) {
    // A unit's parameters and gradients are whole while it runs.
    double largest = 0;
    for (const auto& [name, e] : unitElements) largest = std::max(largest, e);
    b.unit = 2 * 4 * largest;
  } else if (shardedGradients) {
    // Stage 2: a bucket filling while the one before is exchanged.
    b.unit = 2 * std::min(bucketCapMb * (1 << 20), 4 * elements);
  }
  // Every rank builds the model whole before it is cut into parts.
  b.wholeModel = 4 * (fixed + elements);
  return b;
}

std::string checkStateFits(const StateBytes& need, const memory::Limit& limit, int localRanks,
                           int rank, int worldSize, int stage) {
  if (limit.bytes == 0 || localRanks < 1) return "";
  const double share = static_cast<double>(limit.bytes) / localRanks;
  const std::string held = fmt::format(
      "ZeRO stage {} on {}: parameters {}, gradients {}, optimizer state {}{}; this "
      "machine allows {} ({}) for its {}: {} each",
      stage, ranks(worldSize), mb(need.parameters), mb(need.gradients), mb(need.optimizer),
      need.unit == 0 ? std::string()
      : stage == 3  ? fmt::format(", one gathered unit's parameters and gradients {}", mb(need.unit))
                    : fmt::format(", full gradient buckets in flight {}", mb(need.unit)),
      mb(static_cast<double>(limit.bytes)), limit.source, ranks(localRanks), mb(share));
  if (need.total() > share) {
    throw ConfigError(fmt::format(
        "rank {}: the training state does not fit in memory: it needs at least {} per rank ({}), "
        "before activations and LibTorch itself. {}",
        rank, mb(need.total()), held,
        stage < 3 ? "distribution.zero: 3 divides the parameters, gradients and optimizer state "
                    "by the number of ranks, and ranks on other machines divide them further"
                  : "More ranks (on other machines) divide it further; or give the job more memory"));
  }
  if (need.total() > 0.8 * share) {
    return fmt::format("rank {}: the training state takes {} of the {} per rank this machine "
                       "allows ({}); activations may not fit",
                       rank, mb(need.total()), mb(share), held);
  }
  return "";
}

}  // namespace cohort::train::detail
