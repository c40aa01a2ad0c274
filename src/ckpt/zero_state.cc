#include "cohort/ckpt/zero_state.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/rank_state.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/error.h"
#include "core/detail/json_int.h"

namespace cohort::ckpt {

namespace {

// The state kinds a parameter can have; "step" is a count, not per element.
constexpr const char* kElementKinds[] = {"exp_avg", "exp_avg_sq", "momentum_buffer"};

// A tensor's elements in memory order, as a 1-D view (its memory is dense).
at::Tensor memoryOrder(const at::Tensor& t) {
  return t.as_strided({t.numel()}, {1}, t.storage_offset());
}

std::vector<int64_t> ints(const nlohmann::json& j) { return jsonInts<int64_t>(j); }

// What a checkpoint holds of one pipeline stage (of the whole model without
// a pipeline): its files' names and its ZeRO layout (extra.zero, or a
// pipeline's extra.pipeline.stage_zero[stage]; null without ZeRO).
struct Stage {
  int stage = 0;
  int stages = 1;
  nlohmann::json zero;
  std::string file(const std::string& name) const { return stageFile(stage, stages, name); }
};

int stagesOf(const Manifest& m) {
  return m.extra.contains("pipeline") ? jsonInt<int>(m.extra["pipeline"].value("stages", nlohmann::json(1))) : 1;
}

Stage stageOf(const std::string& dir, const Manifest& m, int stage) {
  Stage s;
  s.stages = stagesOf(m);
  s.stage = stage;
  if (s.stages == 1) {
    if (m.extra.contains("zero")) s.zero = m.extra["zero"];
    return s;
  }
  const nlohmann::json& layouts = m.extra["pipeline"].value("stage_zero", nlohmann::json());
  if (layouts.is_array()) {
    if (stage >= static_cast<int>(layouts.size())) {
      throw DataError(fmt::format("{}/manifest.json: extra.pipeline.stage_zero has no stage {}", dir, stage));
    }
    s.zero = layouts[static_cast<size_t>(stage)];
  }
  return s;
}

// A sharded checkpoint's layout (extra.zero) and every rank's parts of one
// kind of file, by name ("part<k>..."), read from `file(r)`.
struct Parts {
  const nlohmann::json& z;
  int world = 0;
  std::string dir;
  std::function<std::string(int)> file;
  std::vector<std::map<std::string, at::Tensor>> byRank;
};

Parts readParts(const std::string& dir, const Stage& stage, std::function<std::string(int)> file) {
  const nlohmann::json& z = stage.zero;
  if (!z.contains("world_size") || !z.contains("buckets") || !z.contains("params")) {
    throw DataError(fmt::format("{}/manifest.json: extra.zero lacks world_size, buckets or params "
                                "(written by an older cohort?)", dir));
  }
  Parts p{z, jsonInt<int>(z["world_size"]), dir, std::move(file), {}};
  p.byRank.resize(static_cast<size_t>(p.world));
  for (int r = 0; r < p.world; ++r) {
    for (auto& [name, t] : readTensorFile(dir + "/" + p.file(r)).tensors) p.byRank[static_cast<size_t>(r)][name] = t;
  }
  return p;
}

// Bucket k's parameters: (name, elements).
std::vector<std::pair<std::string, int64_t>> members(const nlohmann::json& z, size_t k) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& name : z["buckets"][k]) {
    int64_t n = 1;
    for (int64_t s : ints(z["params"].at(name.get<std::string>())["shape"])) n *= s;
    out.emplace_back(name.get<std::string>(), n);
  }
  return out;
}

// Bucket k of layout `z` cut into `world` parts: each part's elements.
int64_t chunkOf(const nlohmann::json& z, size_t k, int world) {
  int64_t total = 0;
  for (const auto& m : members(z, k)) total += m.second;
  return (total + world - 1) / world;
}

// Bucket k's parts (one per rank, in rank order) cut back into its
// parameters (in their shapes and strides), appended to `whole` as
// "<name><suffix>".
void unpackPieces(const nlohmann::json& z, size_t k, const std::vector<at::Tensor>& pieces,
                  const std::string& suffix, StateDict& whole) {
  const at::Tensor flat = torch::cat(pieces);
  int64_t offset = 0;
  for (const auto& [name, n] : members(z, k)) {
    const auto& info = z["params"].at(name);
    at::Tensor t = at::empty_strided(ints(info["shape"]), ints(info["strides"]), flat.options());
    memoryOrder(t).copy_(flat.narrow(0, offset, n));
    whole.emplace_back(name + suffix, t);
    offset += n;
  }
}

// Bucket k's `key` from every rank's parts, cut back into its parameters.
void unpackBucket(const Parts& p, size_t k, const std::string& key, const std::string& suffix,
                  StateDict& whole) {
  const int64_t chunk = chunkOf(p.z, k, p.world);
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < p.world; ++r) {
    const auto& mine = p.byRank[static_cast<size_t>(r)];
    auto it = mine.find(key);
    if (it == mine.end() || it->second.numel() != chunk) {
      throw DataError(fmt::format("{}/{}: '{}' is missing or not of {} elements, as extra.zero "
                                  "lays bucket {} out", p.dir, p.file(r), key, chunk, k));
    }
    pieces.push_back(it->second.flatten());
  }
  unpackPieces(p.z, k, pieces, suffix, whole);
}

// The stages' dicts as one, each name once (the first stage's of a tensor
// two stages hold), in stage order.
StateDict merged(const std::string& dir, const Manifest& m,
                 StateDict (*one)(const std::string&, const Manifest&, int)) {
  const int stages = stagesOf(m);
  if (stages == 1) return one(dir, m, 0);
  StateDict all;
  std::set<std::string> names;
  for (int s = 0; s < stages; ++s) {
    for (auto& [name, t] : one(dir, m, s)) {
      if (names.insert(name).second) all.emplace_back(name, t);
    }
  }
  return all;
}

}  // namespace

StateDict wholeOptimizerState(const std::string& dir, const Manifest& m) {
  return merged(dir, m, stageOptimizerState);
}

StateDict checkpointModel(const std::string& dir, const Manifest& m) {
  return merged(dir, m, stageModel);
}

nlohmann::json stageZeroLayout(const std::string& dir, const Manifest& m, int stage) {
  return stageOf(dir, m, stage).zero;
}

StateDict stageOptimizerState(const std::string& dir, const Manifest& m, int stage) {
  const Stage st = stageOf(dir, m, stage);
  if (st.zero.is_null()) {
    const std::string file = dir + "/" + st.file(optimizerFile(false, 0));
    return readTensorFile(file).tensors;
  }
  const Parts parts = readParts(dir, st, [&](int r) { return st.file(optimizerFile(true, r)); });
  StateDict whole;
  for (size_t k = 0; k < parts.z["buckets"].size(); ++k) {
    const std::string part = fmt::format("part{}", k);
    for (const char* kind : kElementKinds) {
      const std::string key = part + "." + kind;
      if (parts.byRank[0].count(key) != 0) unpackBucket(parts, k, key, std::string(".") + kind, whole);
    }
    if (auto step = parts.byRank[0].find(part + ".step"); step != parts.byRank[0].end()) {
      for (const auto& [name, n] : members(parts.z, k)) whole.emplace_back(name + ".step", step->second.clone());
    }
  }
  return whole;
}

StateDict stageModel(const std::string& dir, const Manifest& m, int stage) {
  const Stage st = stageOf(dir, m, stage);
  StateDict rest = readTensorFile(dir + "/" + st.file("model.bin")).tensors;
  if (st.zero.is_null() || !st.zero.value("model_parts", false)) return rest;
  const Parts parts = readParts(dir, st, [&](int r) { return st.file(modelPartFile(r)); });
  StateDict whole;
  for (size_t k = 0; k < parts.z["buckets"].size(); ++k) {
    unpackBucket(parts, k, fmt::format("part{}", k), "", whole);
  }
  std::map<std::string, at::Tensor> byName(whole.begin(), whole.end());
  for (auto& [name, t] : rest) byName.emplace(name, t);
  StateDict out;
  for (const auto& name : parts.z.value("model_order", nlohmann::json::array())) {
    auto it = byName.find(name.get<std::string>());
    if (it == byName.end()) {
      throw DataError(fmt::format("{}: '{}' is in neither {} nor the parameter parts "
                                  "(extra.zero.model_order)", dir, name.get<std::string>(), st.file("model.bin")));
    }
    out.emplace_back(it->first, it->second);
  }
  if (out.size() != byName.size()) {
    throw DataError(fmt::format("{}: {} and the parameter parts hold {} tensors, "
                                "extra.zero.model_order names {}", dir, st.file("model.bin"), byName.size(), out.size()));
  }
  return out;
}

std::optional<std::vector<at::Tensor>> ownModelParts(const std::string& dir, const Manifest& m,
                                                     int stage, int world, int rank,
                                                     const std::vector<std::vector<std::string>>& buckets) {
  const Stage st = stageOf(dir, m, stage);
  const nlohmann::json& z = st.zero;
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
    int64_t total = 0;
    for (const auto& [name, n] : members(z, k)) total += n;
    const int64_t chunk = (total + world - 1) / world;
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
  std::vector<std::string> order;
  std::set<std::string> seen;
  auto once = [&](const std::string& name, const at::Tensor& t) {
    if (seen.insert(name).second) visit(name, t);
  };
  for (int s = 0; s < stagesOf(m); ++s) {
    const Stage st = stageOf(dir, m, s);
    std::vector<std::string> names;  // this stage's, in its model's order
    visitTensorFile(dir + "/" + st.file("model.bin"), {}, [&](const std::string& name, at::Tensor t) {
      names.push_back(name);
      once(name, t);
    });
    const nlohmann::json& z = st.zero;
    if (!z.is_null() && z.value("model_parts", false)) {
      if (!z.contains("world_size") || !z.contains("buckets") || !z.contains("params")) {
        throw DataError(fmt::format("{}/manifest.json: extra.zero lacks world_size, buckets or params "
                                    "(written by an older cohort?)", dir));
      }
      const int world = jsonInt<int>(z["world_size"]);
      // One bucket at a time: its part from every rank's file, put together.
      for (size_t k = 0; k < z["buckets"].size(); ++k) {
        const std::string key = fmt::format("part{}", k);
        const int64_t chunk = chunkOf(z, k, world);
        std::vector<at::Tensor> pieces;
        for (int r = 0; r < world; ++r) {
          const std::string file = dir + "/" + st.file(modelPartFile(r));
          at::Tensor piece;
          visitTensorFile(file, [&](const TensorInfo& i) { return i.name == key; },
                          [&](const std::string&, at::Tensor t) { piece = std::move(t); });
          if (!piece.defined() || piece.numel() != chunk) {
            throw DataError(fmt::format("{}: '{}' is missing or not of {} elements, as extra.zero "
                                        "lays bucket {} out", file, key, chunk, k));
          }
          pieces.push_back(piece.flatten());
        }
        StateDict params;
        unpackPieces(z, k, pieces, "", params);
        pieces.clear();
        for (auto& [name, t] : params) once(name, t);
      }
      names.clear();
      for (const auto& name : z.value("model_order", nlohmann::json::array())) {
        names.push_back(name.get<std::string>());
      }
    }
    for (auto& name : names) {
      if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
    }
  }
  if (order.size() != seen.size()) {
    throw DataError(fmt::format("{}: model.bin and the parameter parts hold {} tensors, "
                                "extra.zero.model_order names {}", dir, seen.size(), order.size()));
  }
  return order;
}

StateDict stageModelRest(const std::string& dir, const Manifest& m, int stage) {
  return readTensorFile(dir + "/" + stageOf(dir, m, stage).file("model.bin")).tensors;
}

StateDict partsFromWhole(const StateDict& whole, const std::vector<std::string>& names,
                         const std::vector<std::vector<PartSlice>>& parts,
                         const std::vector<int64_t>& sizes, const StateDict& live,
                         const std::string& origin) {
  COHORT_ASSERT(names.size() == parts.size() && sizes.size() == parts.size(), "parts");
  std::map<std::string, at::Tensor> byName(whole.begin(), whole.end());
  std::map<std::string, at::Tensor> params(live.begin(), live.end());
  torch::NoGradGuard noGrad;
  StateDict out;
  for (size_t k = 0; k < parts.size(); ++k) {
    if (parts[k].empty()) continue;
    const std::string& first = parts[k].front().param;
    if (auto it = byName.find(first + ".step"); it != byName.end()) {
      out.emplace_back(names[k] + ".step", it->second.clone());
    }
    for (const char* kind : kElementKinds) {
      if (byName.count(first + "." + kind) == 0) continue;
      at::Tensor part = torch::zeros({sizes[k]}, torch::kFloat);
      for (const PartSlice& s : parts[k]) {
        auto it = byName.find(s.param + "." + kind);
        auto p = params.find(s.param);
        COHORT_ASSERT(p != params.end(), "no live parameter ", s.param);
        if (it == byName.end() || it->second.sizes() != p->second.sizes()) {
          throw DataError(fmt::format("{}: optimizer state '{}.{}' is {} (the parameter is [{}])",
                                      origin, s.param, kind,
                                      it == byName.end() ? std::string("missing")
                                                         : fmt::format("[{}]", fmt::join(it->second.sizes(), ", ")),
                                      fmt::join(p->second.sizes(), ", ")));
        }
        // In this run's memory order of the parameter, then the run of it.
        at::Tensor laid = at::empty_strided(p->second.sizes(), p->second.strides(), part.options());
        laid.copy_(it->second);
        part.narrow(0, s.at, s.length).copy_(memoryOrder(laid).narrow(0, s.offset, s.length));
      }
      out.emplace_back(names[k] + "." + kind, part);
    }
  }
  return out;
}

}  // namespace cohort::ckpt
