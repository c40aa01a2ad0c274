#include "cohort/ckpt/zero_state.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/rank_state.h"
#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/tensor_file.h"
#include "ckpt/detail/parts.h"
#include "cohort/core/error.h"
#include "core/detail/json_int.h"

namespace cohort::ckpt {

namespace {

using detail::kElementKinds;
using detail::memoryOrder;

}  // namespace

nlohmann::json stageZeroLayout(const std::string& dir, const Manifest& m, int stage) {
  return StageTensors(dir, m, stage).zero();
}

StateDict stageOptimizerState(const std::string& dir, const Manifest& m, int stage, int slice) {
  StageTensors st(dir, m, stage, slice);
  StateDict whole;
  for (const std::string& name : st.optimizerNames()) whole.emplace_back(name, st.optimizerState(name));
  return whole;
}

StateDict stageModel(const std::string& dir, const Manifest& m, int stage, int slice) {
  StageTensors st(dir, m, stage, slice);
  StateDict out;
  for (const auto& [name, t] : st.entries()) out.emplace_back(name, st.load(name));
  return out;
}

std::optional<std::vector<at::Tensor>> ownModelParts(const std::string& dir, const Manifest& m,
                                                     int stage, int world, int rank,
                                                     const std::vector<std::vector<std::string>>& buckets) {
  const StageTensors st(dir, m, stage);
  const nlohmann::json& z = st.zero();
  if (z.is_null() || !z.value("model_parts", false) || jsonInt<int>(z.value("stage", nlohmann::json(0))) != 3 ||
      jsonInt<int>(z.value("world_size", nlohmann::json(0))) != world || !z.contains("buckets") ||
      z["buckets"].size() != buckets.size()) {
    return std::nullopt;
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    if (z["buckets"][k].get<std::vector<std::string>>() != buckets[k]) return std::nullopt;
  }
  const std::string file = dir + "/" + st.file(modelPartFile(rank));
  std::map<std::string, at::Tensor> byName;
  for (auto& [name, t] : readTensorFile(file).tensors) byName[name] = t;
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const int64_t chunk = (st.bucketElements(k) + world - 1) / world;
    auto it = byName.find(fmt::format("part{}", k));
    if (it == byName.end() || it->second.numel() != chunk) {
      throw DataError(fmt::format("{}: 'part{}' is missing or not of {} elements, as extra.zero lays "
                                  "bucket {} out", file, k, chunk, k));
    }
    out.push_back(it->second.flatten());
  }
  return out;
}

std::vector<std::string> visitCheckpointModel(const std::string& dir, const Manifest& m,
                                              const TensorVisit& visit) {
  // In the model's order, which is the buckets' in reverse: one bucket
  // put together at a time.
  CheckpointTensors all(dir, m);
  std::vector<std::string> order;
  for (const auto& [name, t] : all.entries()) {
    order.push_back(name);
    visit(name, all.load(name));
    all.drop(name);
  }
  return order;
}

StateDict stageModelRest(const std::string& dir, const Manifest& m, int stage) {
  return readTensorFile(dir + "/" + StageTensors(dir, m, stage).file("model.bin")).tensors;
}

StateDict partsFromWhole(const StateLookup& whole, const std::vector<std::string>& names,
                         const std::vector<std::vector<PartSlice>>& parts,
                         const std::vector<int64_t>& sizes, const StateDict& live,
                         const std::string& origin) {
  COHORT_ASSERT(names.size() == parts.size() && sizes.size() == parts.size(), "parts");
  std::map<std::string, at::Tensor> params(live.begin(), live.end());
  torch::NoGradGuard noGrad;
  StateDict out;
  for (size_t k = 0; k < parts.size(); ++k) {
    if (parts[k].empty()) continue;
    const std::string& first = parts[k].front().param;
    if (at::Tensor step = whole(first + ".step"); step.defined()) {
      out.emplace_back(names[k] + ".step", step.clone());
    }
    for (const char* kind : kElementKinds) {
      if (!whole(first + "." + kind).defined()) continue;
      at::Tensor part = torch::zeros({sizes[k]}, torch::kFloat);
      for (const PartSlice& s : parts[k]) {
        const at::Tensor state = whole(s.param + "." + kind);
        auto p = params.find(s.param);
        COHORT_ASSERT(p != params.end(), "no live parameter ", s.param);
        if (!state.defined() || state.sizes() != p->second.sizes()) {
          throw DataError(fmt::format("{}: optimizer state '{}.{}' is {} (the parameter is [{}])",
                                      origin, s.param, kind,
                                      !state.defined() ? std::string("missing")
                                                       : fmt::format("[{}]", fmt::join(state.sizes(), ", ")),
                                      fmt::join(p->second.sizes(), ", ")));
        }
        // In this run's memory order of the parameter, then the run of it.
        at::Tensor laid = at::empty_strided(p->second.sizes(), p->second.strides(), part.options());
        laid.copy_(state);
        part.narrow(0, s.at, s.length).copy_(memoryOrder(laid).narrow(0, s.offset, s.length));
      }
      out.emplace_back(names[k] + "." + kind, part);
    }
  }
  return out;
}

}  // namespace cohort::ckpt
