#pragma once

// ZeRO's cut of the optimizer state (docs/zero.md): what each manifest
// records of it, and restoring an optimizer from a checkpoint whatever cut
// wrote it (ckpt/zero_state.h does the cutting).

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "cohort/ckpt/manifest.h"
#include "cohort/config/job.h"
#include "cohort/parallel/plan.h"
#include "cohort/models/model.h"

namespace torch::optim {
class Optimizer;
}

namespace cohort::train::detail {

// distribution.zero > 0: how the optimizer state is cut into parts, as each
// manifest records it (extra.zero): the stage, the world size, the buckets'
// parameter names, each parameter's shape and strides.
nlohmann::json zeroLayout(const JobConfig& job, const parallel::DistributedDataParallel& ddp,
                          const models::Model& model, int worldSize);

// Restores `optimizer` (over `names`: the parameters, or "part<k>" with
// ZeRO) from the checkpoint at `dir` (manifest `m`); `layout` is this run's
// zeroLayout (null without ZeRO). The same cut, or none on both sides, reads
// this rank's file (as `role` names it); any other (a stage, world size or bucket layout of its
// own) puts the checkpoint's state back together and cuts this run's parts
// from it, and logs so. Throws DataError naming the file that is missing or
// does not fit.
void restoreOptimizer(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                      const parallel::DistributedDataParallel& ddp, const models::Model& model,
                      const nlohmann::json& layout, const std::string& dir,
                      const ckpt::Manifest& m, const parallel::CheckpointRole& role);

}  // namespace cohort::train::detail
