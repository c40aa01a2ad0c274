// Writes and digests of a model held in parts, one unit at a time
// (Plan::writeByUnit, Plan::frozenDigestByUnit in parallel/plan.h).

#include <torch/torch.h>

#include <map>
#include <memory>
#include <set>

#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/weights.h"
#include "cohort/core/memory_limit.h"
#include "cohort/models/lora.h"
#include "cohort/parallel/ddp.h"
#include "cohort/parallel/plan.h"

namespace cohort::parallel {

double Plan::writeByUnit(const std::string& path, WeightsFormat format, const security::Key* key,
                         const UnitWrite& what) {
  DistributedDataParallel& engine = *engine_;
  const models::Model& model = *model_;
  const bool root = mesh_.world.rank == 0;
  std::unique_ptr<ckpt::WeightsWriter> out;
  if (root) out = ckpt::openWeightsWriter(path, format, key);
  std::map<std::string, at::Tensor> byName;
  for (const auto& [name, t] : ckpt::stateDict(model)) byName.emplace(name, t);
  // Names handled with their unit (written or left out): the model holds
  // no data for them between gathers.
  std::set<std::string> done;
  auto write = [&](const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      if (root && what.keep(name)) out->add(name, what.value(name, byName.at(name)));
      done.insert(name);
    }
  };
  const auto buckets = engine.bucketParameterNames();
  const auto frozen = engine.frozenBucketNames();
  std::vector<bool> frozenDone(frozen.size(), false);
  for (size_t k = 0; k < buckets.size(); ++k) {
    const int f = engine.frozenBucketOf(k);
    const bool own = what.trainable;
    if (own) engine.gatherBucket(0, k);
    if (f >= 0) engine.gatherFrozen(0, static_cast<size_t>(f));
    write(buckets[k]);
    if (f >= 0) {
      write(frozen[static_cast<size_t>(f)]);
      engine.releaseFrozen(static_cast<size_t>(f));
      frozenDone[static_cast<size_t>(f)] = true;
    }
    if (own) engine.releaseBucket(k);
  }
  for (size_t f = 0; f < frozen.size(); ++f) {
    if (frozenDone[f]) continue;
    engine.gatherFrozen(0, f);
    write(frozen[f]);
    engine.releaseFrozen(f);
  }
  if (!root) return 0;
  std::map<std::string, std::string> aliases;
  for (const auto& [alias, name] : model.tiedNames()) aliases.emplace(alias, name);
  std::vector<std::string> order;
  for (const auto& [name, t] : models::publishedStateDict(model)) {
    if (!what.keep(name)) continue;
    order.push_back(name);
    if (done.count(name) != 0) continue;
    if (auto a = aliases.find(name); a != aliases.end()) {
      out->alias(name, a->second);
    } else {
      out->add(name, what.value(name, t));
    }
    done.insert(name);
  }
  out->finish(order);
  return memory::peakResidentMb();
}

std::string Plan::frozenDigestByUnit() {
  DistributedDataParallel& engine = *engine_;
  const models::Model& model = *model_;
  std::map<std::string, size_t> bucketOf;
  const auto buckets = engine.frozenBucketNames();
  for (size_t k = 0; k < buckets.size(); ++k) {
    for (const std::string& name : buckets[k]) bucketOf.emplace(name, k);
  }
  // models::frozenDigest's tensors, in its order.
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& p : model.named_parameters()) {
    if (!p.value().requires_grad()) params.emplace_back(p.key(), p.value());
  }
  std::map<size_t, size_t> lastUse;
  for (size_t i = 0; i < params.size(); ++i) {
    if (auto it = bucketOf.find(params[i].first); it != bucketOf.end()) lastUse[it->second] = i;
  }
  torch::NoGradGuard noGrad;
  models::FrozenDigest digest;
  std::set<size_t> live;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, value] = params[i];
    auto it = bucketOf.find(name);
    if (it != bucketOf.end() && live.insert(it->second).second) engine.gatherFrozen(-1, it->second);
    digest.add(name, value);
    if (it != bucketOf.end() && lastUse.at(it->second) == i) {
      engine.releaseFrozen(it->second);
      live.erase(it->second);
    }
  }
  return digest.hex();
}

}  // namespace cohort::parallel
