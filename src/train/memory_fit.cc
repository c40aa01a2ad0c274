#include "train/detail/memory_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "cohort/core/error.h"

namespace cohort::train::detail {

namespace {

std::string mb(double bytes) { return fmt::format("{:.0f} MB", bytes / (1 << 20)); }
std::string ranks(int n) { return fmt::format("{} rank{}", n, n == 1 ? "" : "s"); }

}  // namespace

ModelElements countElements(const torch::nn::Module& model, const std::vector<std::string>& units) {
  std::set<const void*> seen;
  // Per unit ("" for the parameters outside every unit): trainable, frozen.
  std::map<std::string, std::pair<double, double>> unitElements;
  ModelElements m;
  for (const auto& p : model.named_parameters()) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    const double n = static_cast<double>(p.value().numel());
    const bool trains = p.value().requires_grad();
    (trains ? m.trainable : m.frozen) += n;
    std::string unit;
    for (const std::string& u : units) {
      if (p.key().rfind(u + ".", 0) == 0) {
        unit = u;
        break;
      }
    }
    (trains ? unitElements[unit].first : unitElements[unit].second) += n;
  }
  for (const auto& b : model.buffers()) {
    if (b.is_floating_point() && seen.insert(b.unsafeGetTensorImpl()).second) m.buffers += static_cast<double>(b.numel());
  }
  for (const auto& [name, e] : unitElements) {
    if (name.empty()) continue;
    m.unit = std::max(m.unit, 2 * e.first);
    m.unitWithFrozen = std::max(m.unitWithFrozen, 2 * e.first + e.second);
  }
  if (auto outside = unitElements.find(""); outside != unitElements.end()) {
    m.unit += 2 * outside->second.first;
    m.unitWithFrozen += 2 * outside->second.first + outside->second.second;
  }
  return m;
}

std::string MemoryShare::describe() const {
  return fmt::format("{} ({}) for {}", mb(static_cast<double>(limit.bytes)), limit.source, ranks(sharers));
}

MemoryShare memoryShare(const comm::Comm& comm) {
  MemoryShare m;
  m.limit = memory::processLimit();
  // The same machine and the same limit's file: the same memory. MemTotal
  // is the machine's; a cgroup's file names the cgroup.
  const std::string mine = comm::machineIdentity(comm.rank) + "\n" + m.limit.source;
  const auto all = comm::allGather(comm, "memory limit", mine);
  m.sharers = static_cast<int>(std::count(all.begin(), all.end(), mine));
  return m;
}

std::string checkStateFits(const StateBytes& need, const memory::Limit& limit, int sharers,
                           int rank, int worldSize, int stage) {
  if (limit.bytes == 0 || sharers < 1) return "";
  const int localRanks = sharers;
  const double share = static_cast<double>(limit.bytes) / localRanks;
  const std::string held = fmt::format(
      "ZeRO stage {} on {}: parameters {}, gradients {}, optimizer state {}{}; the "
      "memory limit is {} ({}) for {}: {} each",
      stage, ranks(worldSize), mb(need.parameters), mb(need.gradients), mb(need.optimizer),
      need.unit == 0 ? std::string()
      : stage == 3  ? fmt::format(", one gathered unit's parameters and gradients {}", mb(need.unit))
                    : fmt::format(", full gradient buckets in flight {}", mb(need.unit)),
      mb(static_cast<double>(limit.bytes)), limit.source, ranks(localRanks), mb(share));
  if (need.total() > share) {
    // What would fit: stage 3 on enough ranks of this share each.
    const double room = share - need.fixed - need.stage3Unit;
    std::string fits;
    if (room > 0) {
      const int ranksNeeded = std::max(1, static_cast<int>(std::ceil(need.shardable / room)));
      fits = fmt::format("distribution.zero: 3 on at least {} (each with {}: {} of parameters, "
                         "gradients and optimizer state apiece) would fit; ",
                         ranks(ranksNeeded), mb(share), mb(need.shardable / ranksNeeded));
      if (stage < 3) {
        fits += fmt::format("stage 3 on these {} would need {} per rank; ", ranks(worldSize),
                            mb(need.fixed + need.shardable / worldSize + need.stage3Unit));
      }
    } else {
      fits = fmt::format("even one unit's parameters and gradients ({}) with the frozen weights and "
                         "buffers ({}) take the {} a rank has, whatever the ranks; ",
                         mb(need.stage3Unit), mb(need.fixed), mb(share));
    }
    throw ConfigError(fmt::format(
        "rank {}: the training state does not fit in memory: it needs at least {} per rank ({}), "
        "before activations and LibTorch itself. {}or give each rank more memory "
        "(model.recompute: blocks shrinks the activations, not this state)",
        rank, mb(need.total()), held, fits));
  }
  if (need.total() > 0.8 * share) {
    return fmt::format("rank {}: the training state takes {} of the {} this rank may use "
                       "({}); activations may not fit",
                       rank, mb(need.total()), mb(share), held);
  }
  return "";
}

}  // namespace cohort::train::detail
