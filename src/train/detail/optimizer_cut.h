#pragma once

// Restoring an optimizer from a checkpoint whatever cut of ZeRO wrote it
// (docs/zero.md): the plan says how this run cuts the state
// (Plan::zeroLayout, optimizerSlices), ckpt/zero_state.h does the cutting.

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "cohort/ckpt/manifest.h"
#include "cohort/parallel/plan.h"

namespace torch::optim {
class Optimizer;
}

namespace cohort::train::detail {

// Restores `optimizer` (over `names`: the parameters, or "part<k>" with
// ZeRO) from the checkpoint at `dir` (manifest `m`); `layout` is this run's
// plan.zeroLayout() (null without ZeRO). The same cut, or none on both
// sides, reads this rank's file (as plan.checkpointRole() names it); any
// other (a stage, world size or bucket layout of its own) puts the
// checkpoint's state back together and cuts this run's parts from it, and
// logs so. `restaged` (a checkpoint of other pipeline stages): each
// parameter's state from whichever of the checkpoint's stages holds it.
// Throws DataError naming the file that is missing or does not fit.
void restoreOptimizer(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                      const parallel::Plan& plan, const nlohmann::json& layout,
                      const std::string& dir, const ckpt::Manifest& m, bool restaged = false);

}  // namespace cohort::train::detail
