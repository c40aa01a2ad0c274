#pragma once

// ZeRO stage 3 without the whole model in any process (docs/zero.md, "Built,
// loaded and saved unit by unit"): how a model built unit by unit takes
// weights from a file, each rank keeping only its parts (parallel/
// unit_parts.h).

#include <string>
#include <vector>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/comm/comm.h"
#include "cohort/models/model.h"
#include "cohort/parallel/unit_parts.h"

namespace cohort::parallel {

// Puts `dict` (tensors of the model, or of its pipeline part, by name; a
// tied tensor's second name dropped) into a unit-built model: each unit
// `units` holds is cut again from its tensors, the rest is loaded into the
// model strictly. Throws DataError naming `origin` and the tensor.
// With `lazy`, `dict` holds its entries() (no data), read one unit at a
// time: model.init_from or a checkpoint is never held whole.
void loadByUnit(models::Model& model, UnitParts& units, ckpt::StateDict dict,
                const std::string& origin, ckpt::TensorSource* lazy = nullptr);

// A resume of a unit-built model: with the checkpoint cut alike (stage 3,
// the same ranks and units), this rank's parts straight from its own file
// and model.bin's other tensors; otherwise each unit put together from the
// checkpoint's layout in turn and cut again (loadByUnit over
// StageTensors). `peers`: the ranks sharing the parts; `tied`: parameters
// kept out of the buckets (a pipeline's tied embedding).
void resumeByUnit(models::Model& model, UnitParts& units, const std::string& dir,
                  const ckpt::Manifest& m, int stage, const comm::Comm& peers,
                  const std::vector<std::string>& tied);

}  // namespace cohort::parallel
