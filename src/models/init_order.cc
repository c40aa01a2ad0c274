#include "models/init_order.h"

#include <torch/torch.h>

#include <utility>

namespace cohort::models {

void recordShapes(const torch::nn::Module& unit, const std::string& prefix, std::vector<ParamShape>& out) {
  for (const auto& p : unit.named_parameters()) out.push_back({prefix + p.key(), p.value().sizes().vec()});
}

void releaseBlock(const torch::nn::Module& block, const std::string& prefix,
                  const std::function<bool(const std::string&)>& constant, std::map<std::string, at::Tensor>& constants) {
  for (const auto& p : block.named_parameters()) {
    const std::string name = prefix + p.key();
    if (constant(name)) constants.emplace(name, p.value().detach().clone());
    releaseStorage(p.value());
  }
}

void initializeInOrder(torch::nn::Module& model, std::vector<ParamShape> built, const ModelPart& part,
                       const std::string& blocksPrefix, const std::map<std::string, at::Tensor>& constants,
                       const InitStd& init) {
  torch::NoGradGuard noGrad;
  std::map<std::string, at::Tensor> kept;
  for (auto& item : model.named_parameters()) kept.emplace(item.key(), item.value());
  if (!part.exact) {
    built.clear();
    for (auto& [name, t] : kept) built.push_back({name, t.sizes().vec()});
  }
  // With a sink, each kept block's values are made here, in the same order
  // and from the same draws, handed over whole and dropped.
  std::string unit;
  ckpt::StateDict values;
  auto handOver = [&] {
    if (!values.empty()) part.sink->take(unit, std::move(values));
    values.clear();
  };
  for (const ParamShape& p : built) {
    const std::string& name = p.name;
    auto it = kept.find(name);
    const bool streamed = part.sink != nullptr && it != kept.end() && name.rfind(blocksPrefix, 0) == 0;
    at::Tensor value = streamed ? at::Tensor() : (it != kept.end() ? it->second : at::Tensor());
    if (streamed && !part.sink->wantsValues()) continue;
    if (streamed) {
      const std::string of = name.substr(0, name.find('.', blocksPrefix.size()));
      if (of != unit) handOver();
      unit = of;
    }
    const double std = init(name);
    if (std < 0) {  // as built
      if (streamed) values.emplace_back(name, constants.at(name));
      continue;
    }
    if (streamed) {
      value = at::empty(p.sizes);
      values.emplace_back(name, value);
    }
    if (std == 0) {
      if (value.defined()) value.zero_();
      continue;
    }
    if (value.defined()) {
      value.normal_(0.0, std);
    } else {
      at::empty(p.sizes).normal_(0.0, std);
    }
  }
  if (part.sink != nullptr && part.sink->wantsValues()) handOver();
}

}  // namespace cohort::models
