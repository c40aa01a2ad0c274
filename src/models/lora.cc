#include "cohort/models/lora.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <sstream>

#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/models/linear.h"
#include "cohort/models/pretrained.h"
#include "cohort/models/pretrained.h"

namespace cohort::models {

namespace nn = torch::nn;

at::Tensor AdaptableLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = linear(x, weight, bias);
  if (!adapted()) return y;
  return y + b_(a_(dropout_(x))) * scaling_;
}

void AdaptableLinearImpl::adapt(int64_t rank, double alpha, double dropout) {
  COHORT_ASSERT(!adapted(), "layer adapted twice");
  const int64_t in = weight.size(1), out = weight.size(0);
  const auto options = weight.options();
  a_ = register_module("lora_A", nn::Linear(nn::LinearOptions(in, rank).bias(false)));
  b_ = register_module("lora_B", nn::Linear(nn::LinearOptions(rank, out).bias(false)));
  dropout_ = register_module("lora_dropout", nn::Dropout(dropout));
  {
    torch::NoGradGuard noGrad;
    b_->weight.zero_();
  }
  a_->to(options.device(), options.dtype().toScalarType());
  b_->to(options.device(), options.dtype().toScalarType());
  scaling_ = alpha / static_cast<double>(rank);
}

at::Tensor AdaptableLinearImpl::mergedWeight() const {
  torch::NoGradGuard noGrad;
  if (!adapted()) return weight.clone();
  return weight + torch::matmul(b_->weight, a_->weight) * scaling_;
}

namespace {

std::vector<std::string> parts(const std::string& name) {
  std::vector<std::string> out;
  std::stringstream in(name);
  for (std::string p; std::getline(in, p, '.');) out.push_back(p);
  return out;
}

bool matches(const std::string& layer, const std::string& target) {
  const std::vector<std::string> l = parts(layer), t = parts(target);
  if (t.empty() || t.size() > l.size()) return false;
  // "attn" is gpt's attention and llama's self_attn alike.
  auto same = [](const std::string& wanted, const std::string& part) {
    return part == wanted || (wanted == "attn" && part == "self_attn");
  };
  for (size_t i = 0; i + t.size() <= l.size(); ++i) {
    if (std::equal(t.begin(), t.end(), l.begin() + static_cast<std::ptrdiff_t>(i), same)) return true;
  }
  return false;
}

}  // namespace

bool isAdapterName(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

LoraSummary attachLora(Model& model, const LoraConfig& config) {
  std::vector<std::pair<std::string, std::shared_ptr<AdaptableLinearImpl>>> layers;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    if (auto l = std::dynamic_pointer_cast<AdaptableLinearImpl>(m.value())) layers.emplace_back(m.key(), l);
  }
  std::set<std::string> chosen;
  for (const std::string& target : config.targets) {
    bool any = false;
    for (const auto& [name, layer] : layers) {
      if (matches(name, target)) {
        chosen.insert(name);
        any = true;
      }
    }
    if (!any) {
      std::vector<std::string> names;
      for (const auto& l : layers) names.push_back(l.first);
      if (names.size() > 8) {
        names.resize(8);
        names.push_back("...");
      }
      throw ConfigError(fmt::format(
          "model.lora.targets: '{}' matches no layer LoRA can adapt (the model's are: {})", target,
          names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "))));
    }
  }
  LoraSummary s;
  for (const auto& [name, layer] : layers) {
    if (chosen.count(name) == 0) continue;
    layer->adapt(config.rank, config.alpha, config.dropout);
    s.layers.push_back(name);
  }
  for (auto& p : model.named_parameters()) {
    const bool adapter = isAdapterName(p.key());
    p.value().set_requires_grad(adapter);
    (adapter ? s.trainable : s.frozen) += p.value().numel();
  }
  return s;
}

LoraSummary loadFrozenBase(Model& model, const ModelConfig& config) {
  if (!config.initFrom.empty()) {
    const auto file = openPretrained(config.initFrom, config);  // one tensor at a time: no second copy
    loadWeights(model, *file, config.initFrom);
  }
  return attachLora(model, config.lora);
}

bool hasAdapters(const torch::nn::Module& model) {
  for (const auto& p : model.named_parameters()) {
    if (isAdapterName(p.key())) return true;
  }
  return false;
}

ckpt::StateDict trainedState(const Model& model) {
  ckpt::StateDict all = ckpt::stateDict(model);
  if (!hasAdapters(model)) return all;
  std::set<const void*> buffers;
  for (const auto& b : model.buffers()) buffers.insert(b.unsafeGetTensorImpl());
  ckpt::StateDict out;
  for (auto& [name, t] : all) {
    if (isAdapterName(name) || buffers.count(t.unsafeGetTensorImpl())) out.emplace_back(name, t);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> trainableParameters(const Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model.named_parameters()) {
    if (p.value().requires_grad()) out.emplace_back(p.key(), p.value());
  }
  return out;
}

ckpt::StateDict adapterStateDict(const Model& model) {
  ckpt::StateDict out;
  for (auto& [name, t] : ckpt::stateDict(model)) {
    if (isAdapterName(name)) out.emplace_back(name, t);
  }
  return out;
}

ckpt::StateDict frozenStateDict(const Model& model) {
  ckpt::StateDict out;
  for (auto& [name, t] : publishedStateDict(model)) {
    if (!isAdapterName(name)) out.emplace_back(name, t);
  }
  return out;
}

ckpt::StateDict mergedStateDict(const Model& model) {
  std::map<std::string, at::Tensor> merged;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    if (auto l = std::dynamic_pointer_cast<AdaptableLinearImpl>(m.value()); l && l->adapted()) {
      merged[m.key() + ".weight"] = l->mergedWeight();
    }
  }
  ckpt::StateDict out;
  for (auto& [name, t] : publishedStateDict(model)) {
    if (isAdapterName(name)) continue;
    auto it = merged.find(name);
    out.emplace_back(name, it == merged.end() ? t : it->second);
  }
  return out;
}

void FrozenDigest::add(const std::string& name, const at::Tensor& value) {
  const at::Tensor t = value.detach().to(at::kCPU).contiguous();
  hash_.update(name.data(), name.size());
  hash_.update(t.data_ptr(), t.nbytes());
}

std::string frozenDigest(const Model& model) {
  FrozenDigest d;
  for (const auto& p : model.named_parameters()) {
    if (!p.value().requires_grad()) d.add(p.key(), p.value());
  }
  return d.hex();
}

}  // namespace cohort::models
