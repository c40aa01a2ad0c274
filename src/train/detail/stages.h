#pragma once

// A pipeline's stages as the trainer sets them up (distribution.pipeline,
// docs/parallelism.md): which blocks each stage holds, measured when the
// split is `auto`, kept from the checkpoint a run resumes, and what the
// manifests record of it.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cohort/ckpt/manifest.h"
#include "cohort/config/job.h"
#include "cohort/models/model.h"
#include "cohort/parallel/mesh.h"
#include "train/detail/setup.h"

namespace cohort::train::detail {

// The blocks of each stage: distribution.pipeline.split; for `auto`, the
// split of the checkpoint the run resumes when its stages are this job's,
// or else one balanced by each block's time, which rank 0 measures
// (forward and backward of one micro-batch, one block built at a time) and
// every rank takes. A checkpoint of other stages or another split (or a
// pipeline where the job has none, or the reverse) resumes restaged
// (`restaged`): each stage reads its blocks' tensors and their optimizer
// state from whichever stages of the checkpoint hold them, at any ZeRO
// stage.
std::vector<int64_t> resolveSplit(const JobConfig& job, const Datasets& data,
                                  const parallel::Mesh& mesh,
                                  const std::optional<ckpt::Manifest>& resumed,
                                  const std::string& resumeFrom, bool& restaged);

// Stage `stage`'s part of the model for `split` (blocks per stage).
models::ModelPart partOf(const std::vector<int64_t>& split, int stage);

// What each manifest records of the pipeline (extra.pipeline), without the
// stages' ZeRO layouts (stage_zero), which gatherStageLayouts adds.
nlohmann::json pipelineLayout(const JobConfig& job, const parallel::Mesh& mesh,
                              const std::vector<int64_t>& split);

// Every stage's ZeRO layout (`mine`: this rank's, null without ZeRO), in
// stage order, on every rank (each rank's held state between elastic
// rounds records them, ckpt::requiredFiles). Collective over the job.
nlohmann::json gatherStageLayouts(const parallel::Mesh& mesh, const nlohmann::json& mine);

}  // namespace cohort::train::detail
