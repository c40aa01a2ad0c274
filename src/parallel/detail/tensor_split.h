#pragma once

// What a plan over a model split by a tensor group does beyond data
// parallelism, shared by the tensor plan (tensor_plan.cc) and a pipeline of
// split stages (pipeline.cc).

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <vector>

#include "cohort/ckpt/zero_state.h"
#include "cohort/parallel/mesh.h"
#include "cohort/parallel/plan.h"
#include "cohort/parallel/tensor_model.h"

namespace cohort::parallel::detail {

// This rank's share of the whole model's squared gradient norm, from the
// gradients of what its engine steps (`parts`, each with its slices of
// the parameters): a split tensor's squares whole, a tensor every rank of
// the group of `tensors` holds whole 1/T of them. Summed over a tensor
// group (and over ZeRO's parts) it counts every element once.
double splitSquares(const std::vector<at::Tensor>& parts, const std::vector<std::vector<ckpt::PartSlice>>& slices,
                    int tensors);
// Sequence parallelism: the gradients of the tensors every rank holds
// whole (each rank computed them from its part of the sequence), as runs of
// `parts`, summed over `group` in one exchange. The same ranges of the same
// parts on every rank of the group. Collective.
void sumWholeGradients(const std::vector<at::Tensor>& parts,
                       const std::vector<std::vector<ckpt::PartSlice>>& slices, const comm::Comm& group);

// The mean cross-entropy of the vocabulary slice `output` [..., V/T]
// against `labels` (collective over the model's group).
at::Tensor splitOutputLoss(TensorParallelModel& model, const at::Tensor& output, const at::Tensor& labels);
// Evaluation's counts from the slices: the loss, and the top 1 and 5 of
// the whole vocabulary from each rank's top 5 (gathered); counted on
// tensor rank 0 only.
OutputScore splitScoreOutput(TensorParallelModel& model, const Mesh& mesh, const at::Tensor& output,
                             const at::Tensor& labels);
// A checkpoint's extra.tensor (ckpt::CheckpointTensors).
nlohmann::json splitLayout(const TensorParallelModel& model, const Mesh& mesh);

}  // namespace cohort::parallel::detail
