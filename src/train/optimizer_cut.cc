#include "train/detail/optimizer_cut.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "cohort/ckpt/rank_state.h"
#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/ckpt/zero_state.h"
#include "cohort/core/log.h"
#include "cohort/models/lora.h"
#include "cohort/train/optimizer.h"
#include "core/detail/json_int.h"

namespace cohort::train::detail {

namespace {

std::string describeLayout(const nlohmann::json& z) {
  return z.is_null() ? std::string("unsharded (distribution.zero 0)")
                     : fmt::format("ZeRO stage {} on {} ranks in {} buckets", jsonInt(z, "stage", 0),
                                   jsonInt(z, "world_size", 0), z.value("buckets", nlohmann::json::array()).size());
}

}  // namespace

void restoreOptimizer(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                      const parallel::Plan& plan, const nlohmann::json& layout,
                      const std::string& dir, const ckpt::Manifest& m) {
  const parallel::CheckpointRole role = plan.checkpointRole();
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
    const std::vector<std::vector<ckpt::PartSlice>> parts = plan.optimizerSlices();
    std::vector<int64_t> sizes;
    for (const at::Tensor& t : plan.optimizerParameters()) sizes.push_back(t.numel());
    loadOptimizerState(optimizer, names,
                       ckpt::partsFromWhole([&](const std::string& name) { return checkpoint.optimizerState(name); },
                                            names, parts, sizes,
                                            models::trainableParameters(plan.model()), dir),
                       dir);
  }
  log::info("optimizer state re-cut: {} in the checkpoint, {} in this run", describeLayout(was),
            describeLayout(layout));
}

}  // namespace cohort::train::detail
