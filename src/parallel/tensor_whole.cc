// The whole model of a model split over a tensor group (parallel/
// tensor_gpt.h): its tensors put back together.

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/parallel/tensor_gpt.h"

namespace cohort::parallel {

at::Tensor wholeFromSlices(const std::vector<at::Tensor>& slices, const TensorCut& cut) {
  COHORT_ASSERT(!slices.empty(), "wholeFromSlices takes at least one slice");
  if (!cut.split()) return slices.front();
  return ckpt::joinSlices(slices, cut.dim, cut.blocks);
}

void visitWholeTensors(const models::Model& model, const comm::Comm& group,
                       const std::function<void(const std::string&, const at::Tensor&)>& visit) {
  visitWholeTensors(ckpt::stateDict(model), group, visit);
}

void visitWholeTensors(const ckpt::StateDict& slices, const comm::Comm& group,
                       const std::function<void(const std::string&, const at::Tensor&)>& visit) {
  torch::NoGradGuard noGrad;
  const bool root = group.rank == 0;
  for (const auto& [name, tensor] : slices) {
    const TensorCut cut = gptTensorCut(name);
    if (!cut.split() || group.worldSize == 1) {
      if (root) visit(name, tensor);
      continue;
    }
    std::vector<at::Tensor> in{tensor.detach().contiguous()};
    std::vector<std::vector<at::Tensor>> out;
    if (root) {
      out.emplace_back();
      for (int r = 0; r < group.worldSize; ++r) out[0].push_back(at::empty_like(in[0]));
    }
    c10d::GatherOptions options;
    options.rootRank = 0;
    comm::wait(group.pg->gather(out, in, options), group, "gathering a split tensor's slices");
    if (root) visit(name, wholeFromSlices(out[0], cut));
  }
}

}  // namespace cohort::parallel
