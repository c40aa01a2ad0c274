// Loading weights into a model built unit by unit (parallel/unit_load.h).

#include "cohort/parallel/unit_load.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>

#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/zero_state.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::parallel {

namespace {

// The unit a parameter belongs to (the first whose name prefixes it), or "".
std::string unitOf(const std::vector<std::string>& units, const std::string& name) {
  for (const auto& u : units) {
    if (name.rfind(u + ".", 0) == 0) return u;
  }
  return "";
}

// Each unit's trainable parameters, by unit ("" for those outside every
// unit, but for `tied`), in the model's order.
std::map<std::string, ckpt::StateDict> parametersByUnit(const models::Model& model,
                                                        const std::vector<std::string>& tied) {
  const std::vector<std::string> units = model.shardingUnits();
  std::map<std::string, ckpt::StateDict> out;
  std::set<const void*> seen;
  for (const auto& p : model.named_parameters()) {
    if (!p.value().requires_grad() || !seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    if (std::find(tied.begin(), tied.end(), p.key()) != tied.end()) continue;
    out[unitOf(units, p.key())].emplace_back(p.key(), p.value());
  }
  return out;
}

// The model's tensors but those the units' parts hold.
ckpt::StateDict outsideParts(const models::Model& model, const std::set<std::string>& inParts) {
  ckpt::StateDict out;
  for (auto& [name, t] : ckpt::stateDict(model)) {
    if (inParts.count(name) == 0) out.emplace_back(name, t);
  }
  return out;
}

}  // namespace

void loadByUnit(models::Model& model, UnitParts& units, ckpt::StateDict dict,
                const std::string& origin, ckpt::TensorSource* lazy) {
  // With `lazy`, dict's tensors have no data: each is read just before it
  // is used and given back after, one unit at a time.
  auto data = [&](const std::string& name, const at::Tensor& t) { return lazy ? lazy->load(name) : t; };
  dict = models::withoutTiedNames(model, std::move(dict));
  std::map<std::string, at::Tensor> byName(dict.begin(), dict.end());
  std::set<std::string> inParts;
  for (auto& [unit, params] : parametersByUnit(model, {})) {
    if (unit.empty() || !units.holds(unit)) continue;
    ckpt::StateDict values;
    for (const auto& [name, live] : params) {
      auto it = byName.find(name);
      if (it == byName.end()) throw DataError(fmt::format("{}: '{}' is missing", origin, name));
      if (!it->second.sizes().equals(live.sizes())) {
        throw DataError(fmt::format("{}: '{}' has shape [{}], the model's is [{}]", origin, name,
                                    fmt::join(it->second.sizes(), ", "), fmt::join(live.sizes(), ", ")));
      }
      // In the parameter's layout, as the engine cuts it.
      at::Tensor v = at::empty_strided(live.sizes(), live.strides(), live.options());
      v.copy_(data(name, it->second));
      if (lazy) lazy->drop(name);
      values.emplace_back(name, v);
      inParts.insert(name);
      byName.erase(it);
    }
    units.take(unit, std::move(values));
  }
  dict.erase(std::remove_if(dict.begin(), dict.end(), [&](const auto& e) { return inParts.count(e.first) > 0; }),
             dict.end());
  for (auto& [name, t] : dict) t = data(name, t);
  ckpt::loadStateDict(outsideParts(model, inParts), dict, origin);
}

void resumeByUnit(models::Model& model, UnitParts& units, const std::string& dir,
                  const ckpt::Manifest& m, int stage, const comm::Comm& peers,
                  const std::vector<std::string>& tied) {
  const std::map<std::string, ckpt::StateDict> byUnit = parametersByUnit(model, tied);
  // The engine's buckets: the last unit first, the parameters outside the
  // units last; each bucket's parameters in the reverse of the model's order.
  std::vector<std::string> order;
  for (const auto& u : model.shardingUnits()) {
    if (byUnit.count(u) != 0) order.insert(order.begin(), u);
  }
  if (byUnit.count("") != 0) order.push_back("");
  std::vector<std::vector<std::string>> buckets;
  for (const auto& u : order) {
    buckets.emplace_back();
    const ckpt::StateDict& params = byUnit.at(u);
    for (auto p = params.rbegin(); p != params.rend(); ++p) buckets.back().push_back(p->first);
  }
  const auto parts = ckpt::ownModelParts(dir, m, stage, peers.worldSize, peers.rank, buckets);
  if (!parts) {
    // Each unit's parameters put together from the checkpoint's layout
    // (one of its buckets at a time) and cut again.
    ckpt::StageTensors checkpoint(dir, m, stage);
    loadByUnit(model, units, checkpoint.entries(), dir, &checkpoint);
    log::info("resumed from {}, cut otherwise than this run: one unit at a time", dir);
    return;
  }
  std::set<std::string> inParts;
  for (size_t k = 0; k < order.size(); ++k) {
    UnitPart part;
    for (const auto& [name, t] : byUnit.at(order[k])) {
      part.names.push_back(name);
      inParts.insert(name);
    }
    part.part = (*parts)[k];
    units.put(order[k], std::move(part));
  }
  ckpt::loadStateDict(outsideParts(model, inParts), ckpt::stageModelRest(dir, m, stage),
                      dir + "/model.bin");
  log::info("resumed this rank's parameter parts from {} (cut alike): no step held the model", dir);
}

}  // namespace cohort::parallel
