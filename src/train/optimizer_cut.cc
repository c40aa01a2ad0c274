#include "train/detail/optimizer_cut.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "cohort/ckpt/rank_state.h"
#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/ckpt/zero_state.h"
#include "cohort/core/log.h"
#include "cohort/models/lora.h"
#include "cohort/parallel/tensor_model.h"
#include "cohort/train/optimizer.h"
#include "core/detail/json_int.h"

#include <map>
#include <memory>
#include <set>

namespace cohort::train::detail {

namespace {

std::string describeLayout(const nlohmann::json& z) {
  return z.is_null() ? std::string("unsharded (distribution.zero 0)")
                     : fmt::format("ZeRO stage {} on {} ranks in {} buckets", jsonInt(z, "stage", 0),
                                   jsonInt(z, "world_size", 0), z.value("buckets", nlohmann::json::array()).size());
}

// This run's parts of the optimizer state (names: the plan's), cut from
// the whole state `whole` gives by name; a part that is a parameter kept
// whole (a pipeline's tied tensors beside ZeRO's parts) in its shape.
ckpt::StateDict partsForPlan(const ckpt::StateLookup& whole, const std::vector<std::string>& names,
                             const parallel::Plan& plan, const std::string& dir) {
  const std::vector<std::vector<ckpt::PartSlice>> parts = plan.optimizerSlices();
  const std::vector<at::Tensor> params = plan.optimizerParameters();
  std::vector<int64_t> sizes;
  for (const at::Tensor& t : params) sizes.push_back(t.numel());
  ckpt::StateDict state = ckpt::partsFromWhole(whole, names, parts, sizes, models::trainableParameters(plan.model()), dir);
  std::map<std::string, at::IntArrayRef> shapes;
  for (size_t k = 0; k < names.size() && k < params.size(); ++k) {
    if (params[k].dim() > 1) shapes.emplace(names[k], params[k].sizes());
  }
  for (auto& [name, t] : state) {
    const size_t dot = name.rfind('.');
    auto it = dot == std::string::npos ? shapes.end() : shapes.find(name.substr(0, dot));
    if (it != shapes.end() && t.numel() == c10::multiply_integers(it->second)) t = t.reshape(it->second);
  }
  return state;
}

// A checkpoint of other stages: this rank's parameters' state, by name,
// from the stages that hold it; cut into this run's parts with ZeRO.
void restoreRestaged(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                     const parallel::Plan& plan, const nlohmann::json& layout, const std::string& dir,
                     const ckpt::Manifest& m) {
  ckpt::CheckpointOptimizer checkpoint(dir, m);
  // Each state whole (a split checkpoint's put together), and with a tensor
  // split here this rank's slice of it.
  const parallel::Mesh& mesh = plan.mesh();
  auto state = [&](const std::string& name) {
    const size_t dot = name.rfind('.');
    const parallel::TensorCut cut = parallel::tensorCut(name.substr(0, dot));
    if (mesh.tensors == 1 || !cut.split() || name.compare(dot + 1, std::string::npos, "step") == 0) {
      return checkpoint.state(name);
    }
    return checkpoint.stateRegion(name, cut.dim, cut.blocks, mesh.tensors, mesh.tensorRank);
  };
  if (layout.is_null()) {
    const std::set<std::string> params(names.begin(), names.end());
    std::vector<std::pair<std::string, at::Tensor>> held;
    for (const std::string& name : checkpoint.names()) {
      const size_t dot = name.rfind('.');
      if (dot != std::string::npos && params.count(name.substr(0, dot)) != 0) held.emplace_back(name, state(name));
    }
    loadOptimizerState(optimizer, names, held, dir);
  } else {
    loadOptimizerState(optimizer, names, partsForPlan(state, names, plan, dir), dir);
  }
  log::info("optimizer state taken from the checkpoint's {} stage(s) for this rank's parameters ({})",
            checkpoint.stages(), describeLayout(layout));
}

}  // namespace

void restoreOptimizer(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                      const parallel::Plan& plan, const nlohmann::json& layout,
                      const std::string& dir, const ckpt::Manifest& m, bool restaged) {
  const parallel::CheckpointRole role = plan.checkpointRole();
  if (restaged) {
    restoreRestaged(optimizer, names, plan, layout, dir, m);
    return;
  }
  const nlohmann::json was = ckpt::stageZeroLayout(dir, m, role.stage);
  const bool sharded = !layout.is_null();
  // The parts, whatever the stage: the world size, the buckets and each
  // parameter's layout (a part holds elements in memory order).
  auto cut = [](const nlohmann::json& z) {
    return z.is_object() ? nlohmann::json{jsonInt(z, "world_size", 0), z.value("buckets", nlohmann::json()),
                                          z.value("params", nlohmann::json())}
                         : nlohmann::json();
  };
  if (cut(was) == cut(layout)) {
    const std::string file =
        dir + "/" + role.file(ckpt::optimizerFile(sharded, role.dataRank));
    loadOptimizerState(optimizer, names, ckpt::readTensorFile(file).tensors, file);
    return;
  }
  if (!sharded) {
    loadOptimizerState(optimizer, names, ckpt::stageOptimizerState(dir, m, role.stage, role.slice), dir);
  } else {
    // This stage's state read one bucket of the checkpoint's layout at a
    // time: a rank keeping a part of the state never holds it whole.
    ckpt::StageTensors checkpoint(dir, m, role.stage, role.slice);
    loadOptimizerState(optimizer, names,
                       partsForPlan([&](const std::string& name) { return checkpoint.optimizerState(name); }, names,
                                    plan, dir),
                       dir);
  }
  log::info("optimizer state re-cut: {} in the checkpoint, {} in this run", describeLayout(was),
            describeLayout(layout));
}

}  // namespace cohort::train::detail
