#pragma once

// The forward of each architecture of cohort's zoo, written once over a
// small set of operations (`Ops`) that the two exporters implement: the ONNX
// writer adds nodes to a graph (onnx_export.cc), the TorchScript writer adds
// lines of TorchScript source (script_export.cc). Values are names: an ONNX
// value's, or a TorchScript local variable's. Weights are named as in the
// model's state dict (torchvision's, nanoGPT's), which both exporters keep.
//
// Each describe* below must compute what the model's C++ forward in eval
// mode computes (src/models/*.cc): the export tests compare the outputs.

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cohort/serve/model.h"

namespace cohort::serve::detail {

// Name -> float32 tensor on the CPU: the model's state dict with LoRA
// adapters merged into their layers' weights and without the second names
// of tied tensors.
using Weights = std::map<std::string, at::Tensor>;
Weights exportWeights(const models::Model& model);
// Whether `name` is the second name of a tied tensor of the job's model
// (the GPT's lm_head.weight, a tied Llama's): exported under its first.
bool isTiedSecondName(const ModelConfig& config, const std::string& name);
// One of them as it is exported: on the CPU, float32 if floating, contiguous.
at::Tensor exportTensor(const at::Tensor& t);

class Ops {
 public:
  explicit Ops(const Weights& weights) : weights_(weights) {}
  virtual ~Ops() = default;

  bool has(const std::string& name) const { return weights_.count(name) > 0; }
  // The weight `name`; throws DataError when the state dict lacks it.
  const at::Tensor& weight(const std::string& name) const;

  // Images: raw pixels -> / 255, then (x - mean) / std per channel.
  virtual std::string normalize(const std::string& x, const std::vector<double>& mean,
                                const std::vector<double>& std) = 0;
  // Conv2d `prefix` (.weight, .bias if present), square kernel from the weight.
  virtual std::string conv(const std::string& x, const std::string& prefix, int64_t stride, int64_t pad) = 0;
  // BatchNorm2d `prefix` in eval mode (running statistics), eps 1e-5.
  virtual std::string batchNorm(const std::string& x, const std::string& prefix) = 0;
  virtual std::string relu(const std::string& x) = 0;
  virtual std::string maxPool(const std::string& x, int64_t kernel, int64_t stride, int64_t pad) = 0;
  // Adaptive average pooling to 1x1, flattened: [B, C, H, W] -> [B, C].
  virtual std::string globalAveragePool(const std::string& x) = 0;
  virtual std::string flatten(const std::string& x) = 0;  // from dimension 1
  // Linear `prefix`: x W^T (+ b), x of any rank.
  virtual std::string linear(const std::string& x, const std::string& prefix) = 0;
  virtual std::string add(const std::string& a, const std::string& b) = 0;

  // Language models: token [B, T] -> wte[tokens] + wpe[0..T).
  virtual std::string embed(const std::string& tokens, const std::string& wte, const std::string& wpe) = 0;
  // LayerNorm over the last dimension, `prefix`.bias if present, eps 1e-5.
  virtual std::string layerNorm(const std::string& x, const std::string& prefix) = 0;
  // Causal multi-head self-attention `prefix` (c_attn, c_proj) with `heads` heads.
  virtual std::string attention(const std::string& x, const std::string& prefix, int64_t heads) = 0;
  // Exact (erf) form, or with `tanh` the tanh approximation (model.activation).
  virtual std::string gelu(const std::string& x, bool tanh) = 0;
  // x [B, T, C] times the embedding `weight` [V, C] transposed: tied head.
  virtual std::string matmulTransposed(const std::string& x, const std::string& weight) = 0;

  // Llama (models/llama.cc). Token [B, T] -> wte[tokens], no positions.
  virtual std::string embedTokens(const std::string& tokens, const std::string& wte) = 0;
  // x / sqrt(mean(x^2 over the last dimension) + eps) * `prefix`.weight.
  virtual std::string rmsNorm(const std::string& x, const std::string& prefix, double eps) = 0;
  // The rotary tables cos and sin [block_size, head_dim] as constants of
  // the export, cut to the input's T rows: their values' names [T, head_dim].
  // Once per forward, after embedTokens.
  virtual std::pair<std::string, std::string> rotaryTables(const at::Tensor& cos, const at::Tensor& sin) = 0;
  // Causal self-attention `prefix` (q_proj, k_proj, v_proj, o_proj, no
  // biases): `heads` query heads over `kvHeads` key/value heads (query head
  // h reads h / (heads / kvHeads)), queries and keys rotated by the tables
  // of rotaryTables (the halves of each head paired: rotate_half).
  virtual std::string rotaryAttention(const std::string& x, const std::string& prefix, int64_t heads,
                                      int64_t kvHeads, const std::pair<std::string, std::string>& rotary) = 0;
  virtual std::string silu(const std::string& x) = 0;
  virtual std::string mul(const std::string& a, const std::string& b) = 0;

 protected:
  const Weights& weights_;
};

// The input's name ("pixels" or "tokens") and the forward of `m` from it;
// returns the logits' value. Throws UsageError for arch torchscript.
std::string describeForward(Ops& ops, const TrainedModel& m, const std::string& input);

}  // namespace cohort::serve::detail
