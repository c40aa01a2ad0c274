#include "cohort/ckpt/zero_state.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>

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

}  // namespace

StateDict wholeOptimizerState(const std::string& dir, const Manifest& m) {
  if (!m.extra.contains("zero")) {
    const std::string file = dir + "/" + optimizerFile(false, 0);
    return readTensorFile(file).tensors;
  }
  const nlohmann::json& z = m.extra["zero"];
  const std::string what = dir + "/manifest.json: extra.zero";
  if (!z.contains("world_size") || !z.contains("buckets") || !z.contains("params")) {
    throw DataError(fmt::format("{} lacks world_size, buckets or params (written by an older "
                                "cohort?)", what));
  }
  const int world = jsonInt<int>(z["world_size"]);
  // Every rank's parts, by name ("part<k>.<kind>").
  std::vector<std::map<std::string, at::Tensor>> parts(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::string file = dir + "/" + optimizerFile(true, r);
    for (auto& [name, t] : readTensorFile(file).tensors) parts[static_cast<size_t>(r)][name] = t;
  }
  StateDict whole;
  const auto& buckets = z["buckets"];
  for (size_t k = 0; k < buckets.size(); ++k) {
    const std::string part = fmt::format("part{}", k);
    int64_t total = 0;
    std::vector<std::pair<std::string, int64_t>> members;  // name, elements
    for (const auto& name : buckets[k]) {
      const auto& info = z["params"].at(name.get<std::string>());
      int64_t n = 1;
      for (int64_t s : ints(info["shape"])) n *= s;
      members.emplace_back(name.get<std::string>(), n);
      total += n;
    }
    const int64_t chunk = (total + world - 1) / world;
    auto step = parts[0].find(part + ".step");
    for (const char* kind : kElementKinds) {
      const std::string key = part + "." + kind;
      if (parts[0].count(key) == 0) continue;
      // The bucket's elements again, from every rank's part.
      std::vector<at::Tensor> pieces;
      for (int r = 0; r < world; ++r) {
        auto it = parts[static_cast<size_t>(r)].find(key);
        if (it == parts[static_cast<size_t>(r)].end() || it->second.numel() != chunk) {
          throw DataError(fmt::format("{}/{}: '{}' is missing or not of {} elements, as extra.zero "
                                      "lays bucket {} out", dir, optimizerFile(true, r), key, chunk, k));
        }
        pieces.push_back(it->second.flatten());
      }
      const at::Tensor flat = torch::cat(pieces);
      int64_t offset = 0;
      for (const auto& [name, n] : members) {
        const auto& info = z["params"].at(name);
        at::Tensor t = at::empty_strided(ints(info["shape"]), ints(info["strides"]), flat.options());
        memoryOrder(t).copy_(flat.narrow(0, offset, n));
        whole.emplace_back(name + "." + kind, t);
        offset += n;
      }
    }
    if (step != parts[0].end()) {
      for (const auto& [name, n] : members) whole.emplace_back(name + ".step", step->second.clone());
    }
  }
  return whole;
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
