#pragma once

// How the decoders (gpt, llama) initialize a part of a model exactly as the
// whole model of the same seed (ModelPart::exact) and hand a ZeRO-3 rank's
// blocks over one at a time (ModelPart::sink): every parameter of the whole
// model is listed in build order, and each draws its random numbers in that
// order, into the kept tensor or into a scratch tensor of its shape.

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cohort/models/model.h"

namespace cohort::models {

// A parameter of the whole model as built.
struct ParamShape {
  std::string name;
  std::vector<int64_t> sizes;
};

// Appends `unit`'s parameters, named under `prefix`.
void recordShapes(const torch::nn::Module& unit, const std::string& prefix, std::vector<ParamShape>& out);

// For a block kept by a part with a sink: the values of its `constant`
// parameters (norm weights, which the initialization does not draw) saved
// into `constants` under prefix + name, and every parameter's storage given
// back (the sink holds them from now on).
void releaseBlock(const torch::nn::Module& block, const std::string& prefix,
                  const std::function<bool(const std::string&)>& constant, std::map<std::string, at::Tensor>& constants);

// A unit (an embedding, a norm, a head) of a part: built with make() when
// the part keeps it, or when it is exact (its construction's random draws
// happen either way), recorded in `built` under `prefix`, and registered
// in `owner` as `name` when kept; nullptr when not.
template <class Make>
auto buildUnit(torch::nn::Module& owner, const std::string& name, const std::string& prefix, bool keep,
               const ModelPart& part, std::vector<ParamShape>& built, Make make) -> decltype(make()) {
  if (!keep && !part.exact) return decltype(make())(nullptr);
  auto m = make();
  recordShapes(*m, prefix, built);
  return keep ? owner.register_module(name, m) : decltype(m)(nullptr);
}

// The `n` blocks of a model, of which `part` keeps some: each built in
// turn with make(i) (all of them when the part is exact, and recorded in
// `built` under prefix + "<i>."), dropped unless kept before the next is
// built; kept ones registered in `holder` as "<i>" (nn.ModuleList's
// names), released to the sink when the part has one (releaseBlock), and
// appended to `blocks` with their index.
template <class Block, class Make>
void buildBlocks(int64_t n, const ModelPart& part, const std::string& prefix, torch::nn::Module& holder,
                 std::vector<ParamShape>& built, const std::function<bool(const std::string&)>& constant,
                 std::map<std::string, at::Tensor>& constants, std::vector<Block>& blocks,
                 std::vector<int64_t>& index, Make make) {
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = part.holds(i, n);
    if (!keep && !part.exact) continue;
    Block block = make(i);
    const std::string at = prefix + std::to_string(i) + ".";
    if (part.exact) recordShapes(*block, at, built);
    if (!keep) continue;
    if (part.sink != nullptr) releaseBlock(*block, at, constant, constants);
    blocks.push_back(holder.register_module(std::to_string(i), block));
    index.push_back(i);
  }
}

// How a parameter starts: `std` < 0: as built (a norm's ones or zeros,
// which draw nothing); 0: zeros; > 0: normal(0, std).
using InitStd = std::function<double(const std::string& name)>;

// Initializes `model`'s parameters in the order of `built` (the whole
// model's, from recordShapes; with !part.exact, only the model's own
// parameters are drawn, in their order). Parameters under `blocksPrefix`
// ("transformer.h.", "model.layers.") go to part.sink block by block when
// it is set, their values made here; `constants` holds those of them
// `init` keeps as built.
void initializeInOrder(torch::nn::Module& model, std::vector<ParamShape> built, const ModelPart& part,
                       const std::string& blocksPrefix, const std::map<std::string, at::Tensor>& constants,
                       const InitStd& init);

}  // namespace cohort::models
