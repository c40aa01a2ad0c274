#include "serve/detail/graph_ops.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "cohort/models/lora.h"

namespace cohort::serve::detail {

Weights exportWeights(const models::Model& model) {
  // The merged dict holds each adapted layer's effective weight W + s B A.
  const ckpt::StateDict dict =
      models::hasAdapters(model) ? models::mergedStateDict(model) : models::publishedStateDict(model);
  Weights out;
  for (const auto& [name, t] : dict) {
    if (name == models::kTiedHeadName) continue;  // the head is transformer.wte.weight
    out.emplace(name, exportTensor(t));
  }
  return out;
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
      throw UsageError("model.arch llama: ONNX and TorchScript export of llama is not written yet; export its "
                       "weights with --format huggingface or safetensors");
    case ModelArch::torchscript:
      break;
  }
  throw UsageError(
      "model.arch torchscript: cohort's graph builders cover its built-in architectures (simple_cnn, "
      "resnet18/34/50/101, gpt); export a TorchScript model with --format torchscript");
}

}  // namespace cohort::serve::detail
