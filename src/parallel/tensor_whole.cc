// The whole model's tensors and a tensor split's slices of them (parallel/
// tensor_model.h): how each is cut, and put back together.

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <cstring>
#include <vector>

#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "cohort/models/llama.h"
#include "cohort/parallel/tensor_model.h"

namespace cohort::parallel {

TensorCut tensorCut(const std::string& name) {
  auto ends = [&](const char* tail) {
    const size_t n = std::strlen(tail);
    return name.size() >= n && name.compare(name.size() - n, n, tail) == 0;
  };
  // The embedding and the head: by the vocabulary.
  if (name == "transformer.wte.weight" || name == models::kTiedHeadName || name == models::kLlamaEmbeddingName) {
    return {0, 1};
  }
  if (name.rfind("transformer.h.", 0) == 0) {
    // The GPT's: c_attn's rows are the query, key and value blocks, each cut by heads.
    if (ends("attn.c_attn.weight") || ends("attn.c_attn.bias")) return {0, 3};
    if (ends("mlp.c_fc.weight") || ends("mlp.c_fc.bias")) return {0, 1};
    if (ends("c_proj.weight")) return {1, 1};  // attention's and the MLP's
    return {};
  }
  if (name.rfind("model.layers.", 0) == 0) {
    // Llama's: q_proj by query heads, k_proj and v_proj by key/value heads,
    // the MLP's gate and up by rows; o_proj and down_proj by columns.
    for (const char* rows : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                             "mlp.gate_proj.weight", "mlp.up_proj.weight"}) {
      if (ends(rows)) return {0, 1};
    }
    if (ends("self_attn.o_proj.weight") || ends("mlp.down_proj.weight")) return {1, 1};
  }
  return {};
}

at::Tensor sliceByCut(const at::Tensor& whole, const TensorCut& cut, int tensors, int rank) {
  if (!cut.split()) return whole.contiguous().clone();
  const int64_t size = whole.size(cut.dim), block = size / cut.blocks, width = block / tensors;
  std::vector<at::Tensor> parts;
  for (int b = 0; b < cut.blocks; ++b) parts.push_back(whole.narrow(cut.dim, b * block + rank * width, width));
  return torch::cat(parts, cut.dim).contiguous();
}

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
    const TensorCut cut = tensorCut(name);
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
