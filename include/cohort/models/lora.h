#pragma once

// LoRA fine-tuning (model.lora): low-rank adapters beside frozen weights.
// An adapted Linear layer computes
//
//   y = x W^T + b + (alpha / r) * dropout(x) A^T B^T,   A: [r, in], B: [out, r]
//
// with W and b frozen. A starts as nn.Linear's default (Kaiming-uniform), B
// at zero, so training starts from the base model's function. The adapter
// tensors are named as PEFT names them under the base model's layer
// (transformer.h.0.attn.c_attn.lora_A.weight, ...lora_B.weight), so
// model/adapters.pt maps onto PEFT's adapter files by adding its prefix.

#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/core/checksum.h"
#include "cohort/config/job.h"
#include "cohort/models/model.h"

namespace cohort::models {

// torch::nn::Linear (same parameters, names and initialization) that can
// be given an adapter. The layers LoRA may adapt are of this type.
class AdaptableLinearImpl : public torch::nn::LinearImpl {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  at::Tensor forward(const at::Tensor& x);

  // Registers lora_A and lora_B (drawing A from the torch generator).
  void adapt(int64_t rank, double alpha, double dropout);
  bool adapted() const { return !a_.is_empty(); }
  // W + (alpha / r) B A, a new tensor (W itself without an adapter).
  at::Tensor mergedWeight() const;

 private:
  torch::nn::Linear a_{nullptr}, b_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  double scaling_ = 0;
};
TORCH_MODULE(AdaptableLinear);

struct LoraSummary {
  std::vector<std::string> layers;  // adapted layers' names
  int64_t trainable = 0;            // parameter values that train: the adapters'
  int64_t frozen = 0;               // parameter values that do not
};

// Adapts every AdaptableLinear of `model` whose name a target of
// config.targets matches, then freezes every parameter but the adapters.
// A target matches a layer when its dotted parts appear, in order and
// together, among the layer name's parts: "attn" and "c_attn" both match
// transformer.h.0.attn.c_attn; the shorthand "mlp" matches h.N.mlp.c_fc and
// h.N.mlp.c_proj. "attn" matches llama's self_attn too (model.layers.N.
// self_attn.q_proj, ...); "mlp" its gate_proj, up_proj and down_proj. Throws ConfigError naming model.lora.targets (and the
// layers there are) when a target matches none.
LoraSummary attachLora(Model& model, const LoraConfig& config);

// A LoRA run's model before its trained tensors are loaded: `config`'s
// init_from (when set) loaded as the frozen weights, then attachLora with
// config.lora. Training (fresh or resumed) and `cohort generate` both start
// here.
LoraSummary loadFrozenBase(Model& model, const ModelConfig& config);

// Whether `name` is an adapter's tensor (lora_A or lora_B of a layer).
bool isAdapterName(const std::string& name);

// Whether the model carries adapters.
bool hasAdapters(const torch::nn::Module& model);

// The tensors training changes, which a checkpoint holds and a resumed run
// loads: the whole state dict, or with adapters only the adapters and the
// buffers (the frozen weights come from model.init_from again).
ckpt::StateDict trainedState(const Model& model);

// The parameters that train, named: all, or with adapters the adapters.
std::vector<std::pair<std::string, at::Tensor>> trainableParameters(const Model& model);

// model/adapters.pt: the adapters alone.
ckpt::StateDict adapterStateDict(const Model& model);

// publishedStateDict() without the adapters: the frozen weights, which load
// into the model before attachLora as model.init_from would.
// model/base.pt of a LoRA run without model.init_from.
ckpt::StateDict frozenStateDict(const Model& model);

// publishedStateDict() with each adapter merged into its layer's weight and
// the adapters left out: it loads into the model without adapters (and
// into PyTorch's module of the architecture). model/final.pt with
// output.merge_lora.
ckpt::StateDict mergedStateDict(const Model& model);

// A digest of the frozen parameters' values. A checkpoint of adapters
// records it, so that resuming over other base weights is refused.
std::string frozenDigest(const Model& model);

// frozenDigest() fed one parameter at a time: the model's parameters
// without gradients, in named_parameters() order (a model held in parts
// gathers each in turn).
class FrozenDigest {
 public:
  void add(const std::string& name, const at::Tensor& value);
  std::string hex() const { return hash_.hex(); }

 private:
  Hasher hash_;
};

}  // namespace cohort::models
