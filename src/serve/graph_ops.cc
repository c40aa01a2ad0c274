#include "serve/detail/graph_ops.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "cohort/core/error.h"
#include "cohort/models/llama.h"
#include "cohort/models/lora.h"

namespace cohort::serve::detail {

Weights exportWeights(const models::Model& model) {
  // The merged dict holds each adapted layer's effective weight W + s B A.
  const ckpt::StateDict dict =
      models::hasAdapters(model) ? models::mergedStateDict(model) : models::publishedStateDict(model);
  Weights out;
  for (const auto& [name, t] : dict) {
    out.emplace(name, exportTensor(t));
  }
  // The head of a tied model is its embedding (transformer.wte.weight,
  // model.embed_tokens.weight).
  for (const auto& [second, first] : model.tiedNames()) out.erase(second);
  return out;
}

bool isTiedSecondName(const ModelConfig& config, const std::string& name) {
  for (const auto& [second, first] : models::tiedNamesOf(config)) {
    if (name == second) return true;
  }
  return false;
}

at::Tensor exportTensor(const at::Tensor& t) {
  at::Tensor w = t.detach().to(torch::kCPU);
  if (w.is_floating_point()) w = w.to(torch::kFloat);
  return w.contiguous();
}

const at::Tensor& Ops::weight(const std::string& name) const {
  const auto it = weights_.find(name);
  if (it == weights_.end()) {
    throw DataError(fmt::format("export: the model's state dict has no tensor {}", name));
  }
  return it->second;
}

namespace {

// models/simple_cnn.cc: conv-bn?-relu-pool twice, fc1-relu, (dropout), fc2.
std::string describeSimpleCnn(Ops& ops, std::string x) {
  for (const char* i : {"1", "2"}) {
    x = ops.conv(x, fmt::format("conv{}", i), 1, 1);
    if (ops.has(fmt::format("bn{}.weight", i))) x = ops.batchNorm(x, fmt::format("bn{}", i));
    x = ops.maxPool(ops.relu(x), 2, 2, 0);
  }
  x = ops.relu(ops.linear(ops.flatten(x), "fc1"));
  return ops.linear(x, "fc2");
}

// models/resnet.cc: torchvision's ResNet (v1.5: a bottleneck strides in
// its 3x3 convolution), the small_input stem or the ImageNet one.
std::string describeResNet(Ops& ops, std::string x, bool smallInput) {
  x = ops.conv(x, "conv1", smallInput ? 1 : 2, smallInput ? 1 : 3);
  x = ops.relu(ops.batchNorm(x, "bn1"));
  if (!smallInput) x = ops.maxPool(x, 3, 2, 1);
  for (int layer = 1; layer <= 4; ++layer) {
    for (int i = 0; ops.has(fmt::format("layer{}.{}.conv1.weight", layer, i)); ++i) {
      const std::string b = fmt::format("layer{}.{}", layer, i);
      const int64_t stride = layer > 1 && i == 0 ? 2 : 1;
      const bool bottleneck = ops.has(b + ".conv3.weight");
      std::string out;
      if (bottleneck) {
        out = ops.relu(ops.batchNorm(ops.conv(x, b + ".conv1", 1, 0), b + ".bn1"));
        out = ops.relu(ops.batchNorm(ops.conv(out, b + ".conv2", stride, 1), b + ".bn2"));
        out = ops.batchNorm(ops.conv(out, b + ".conv3", 1, 0), b + ".bn3");
      } else {
        out = ops.relu(ops.batchNorm(ops.conv(x, b + ".conv1", stride, 1), b + ".bn1"));
        out = ops.batchNorm(ops.conv(out, b + ".conv2", 1, 1), b + ".bn2");
      }
      const std::string identity =
          ops.has(b + ".downsample.0.weight")
              ? ops.batchNorm(ops.conv(x, b + ".downsample.0", stride, 0), b + ".downsample.1")
              : x;
      x = ops.relu(ops.add(out, identity));
    }
  }
  return ops.linear(ops.globalAveragePool(x), "fc");
}

// models/gpt.cc: pre-LN blocks, causal attention, GELU MLP, tied head.
std::string describeGpt(Ops& ops, const std::string& tokens, const ModelConfig& c) {
  std::string x = ops.embed(tokens, "transformer.wte.weight", "transformer.wpe.weight");
  for (int64_t i = 0; i < c.nLayer; ++i) {
    const std::string b = fmt::format("transformer.h.{}", i);
    x = ops.add(x, ops.attention(ops.layerNorm(x, b + ".ln_1"), b + ".attn", c.nHead));
    const std::string h = ops.gelu(ops.linear(ops.layerNorm(x, b + ".ln_2"), b + ".mlp.c_fc"),
                                   c.activation == Activation::geluTanh);
    x = ops.add(x, ops.linear(h, b + ".mlp.c_proj"));
  }
  return ops.matmulTransposed(ops.layerNorm(x, "transformer.ln_f"), "transformer.wte.weight");
}

// models/llama.cc: pre-RMSNorm blocks, rotary grouped-query attention,
// SwiGLU MLP down(silu(gate(x)) * up(x)), tied or untied head. The angle
// tables are the model's: float32, from ropeInverseFrequencies, up to
// block_size.
std::string describeLlama(Ops& ops, const std::string& tokens, const ModelConfig& c, int64_t vocabSize) {
  const models::LlamaOptions o = models::llamaOptions(c, vocabSize);
  const at::Tensor inverse = models::ropeInverseFrequencies(o.nEmbd / o.nHead, o.rope);
  const at::Tensor angles = torch::outer(torch::arange(o.blockSize, torch::kFloat), inverse);
  const at::Tensor both = torch::cat({angles, angles}, -1);  // [block_size, head_dim]
  std::string x = ops.embedTokens(tokens, models::kLlamaEmbeddingName);
  const auto rotary = ops.rotaryTables(both.cos(), both.sin());
  for (int64_t i = 0; i < o.nLayer; ++i) {
    const std::string b = fmt::format("model.layers.{}", i);
    x = ops.add(x, ops.rotaryAttention(ops.rmsNorm(x, b + ".input_layernorm", o.normEps), b + ".self_attn",
                                       o.nHead, o.nKvHead, rotary));
    const std::string h = ops.rmsNorm(x, b + ".post_attention_layernorm", o.normEps);
    const std::string gated = ops.mul(ops.silu(ops.linear(h, b + ".mlp.gate_proj")), ops.linear(h, b + ".mlp.up_proj"));
    x = ops.add(x, ops.linear(gated, b + ".mlp.down_proj"));
  }
  x = ops.rmsNorm(x, "model.norm", o.normEps);
  return o.tiedHead ? ops.matmulTransposed(x, models::kLlamaEmbeddingName) : ops.linear(x, "lm_head");
}

}  // namespace

std::string describeForward(Ops& ops, const TrainedModel& m, const std::string& input) {
  const ModelConfig& c = m.job.model;
  switch (c.arch) {
    case ModelArch::simpleCnn:
      return describeSimpleCnn(ops, ops.normalize(input, m.info.mean, m.info.std));
    case ModelArch::resnet18:
    case ModelArch::resnet34:
    case ModelArch::resnet50:
    case ModelArch::resnet101:
      return describeResNet(ops, ops.normalize(input, m.info.mean, m.info.std), c.smallInput);
    case ModelArch::gpt:
      return describeGpt(ops, input, c);
    case ModelArch::llama:
      return describeLlama(ops, input, c, m.info.vocabSize);
    case ModelArch::bert:
      throw UsageError("model.arch bert: ONNX and TorchScript export of bert is not written yet; export its "
                       "weights with --format huggingface or safetensors");
    case ModelArch::torchscript:
      break;
  }
  throw UsageError(
      "model.arch torchscript: cohort's graph builders cover its built-in architectures (simple_cnn, "
      "resnet18/34/50/101, gpt, llama); export a TorchScript model with --format torchscript");
}

}  // namespace cohort::serve::detail
