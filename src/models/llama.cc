#include "cohort/models/llama.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/models/linear.h"
#include "cohort/models/gpt.h"
#include "cohort/models/lora.h"
#include "models/attention.h"
#include "models/init_order.h"
#include "models/llama_parts.h"
#include "models/recompute.h"

namespace cohort::models {
namespace {

namespace nn = torch::nn;

// The layers model.lora may adapt; Llama's have no biases.
AdaptableLinear llamaLinear(int64_t in, int64_t out) { return AdaptableLinear(nn::LinearOptions(in, out).bias(false)); }

bool isRmsNorm(const std::string& name) { return name.find("norm.") != std::string::npos; }

class LlamaAttentionImpl : public nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaOptions& o) : heads_(o.nHead), kvHeads_(o.nKvHead), d_(o.nEmbd / o.nHead) {
    q_proj_ = register_module("q_proj", llamaLinear(o.nEmbd, heads_ * d_));
    k_proj_ = register_module("k_proj", llamaLinear(o.nEmbd, kvHeads_ * d_));
    v_proj_ = register_module("v_proj", llamaLinear(o.nEmbd, kvHeads_ * d_));
    o_proj_ = register_module("o_proj", llamaLinear(heads_ * d_, o.nEmbd));
    attnDropout_ = register_module("attn_dropout", nn::Dropout(o.dropout));
    residDropout_ = register_module("resid_dropout", nn::Dropout(o.dropout));
  }

  // x [B, T, C] at positions 0 .. T-1, whose angles are cos, sin [T, D].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    auto [q, k, v] = project(x, cos, sin);
    // Each key/value head read by its group of query heads.
    // Dropout only where it drops something (see the GPT's).
    std::function<at::Tensor(const at::Tensor&)> drop;
    if (is_training() && attnDropout_->options.p() > 0) drop = [this](const at::Tensor& a) { return attnDropout_(a); };
    const at::Tensor y = causalAttention(q, widenHeads(k, heads_), widenHeads(v, heads_), mask_, x.options(), drop);
    return residDropout_(o_proj_(y));
  }

  // x [B, T, C]: the rows of `rows` (attention.h), cos and sin [B, 1, T, D]
  // at their positions; their earlier keys and values in the caches, which
  // hold the key/value heads only.
  at::Tensor decode(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                    const std::vector<KvCache*>& caches, size_t layer, const DecodeRows& rows, int64_t capacity) {
    auto [q, k, v] = project(x, cos, sin);
    return o_proj_(cachedAttention(q, k, v, caches, layer, rows, capacity));
  }

 private:
  std::tuple<at::Tensor, at::Tensor, at::Tensor> project(const at::Tensor& x, const at::Tensor& cos,
                                                         const at::Tensor& sin) {
    const int64_t b = x.size(0), t = x.size(1);
    auto heads = [&](const at::Tensor& m, int64_t n) { return m.view({b, t, n, d_}).transpose(1, 2); };
    return {rotate(heads(q_proj_(x), heads_), cos, sin), rotate(heads(k_proj_(x), kvHeads_), cos, sin),
            heads(v_proj_(x), kvHeads_)};
  }

  int64_t heads_, kvHeads_, d_;
  at::Tensor mask_;  // causalAttention's
  AdaptableLinear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  nn::Dropout attnDropout_{nullptr}, residDropout_{nullptr};
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public nn::Module {
 public:
  explicit LlamaMlpImpl(const LlamaOptions& o) {
    gate_proj_ = register_module("gate_proj", llamaLinear(o.nEmbd, o.intermediate));
    up_proj_ = register_module("up_proj", llamaLinear(o.nEmbd, o.intermediate));
    down_proj_ = register_module("down_proj", llamaLinear(o.intermediate, o.nEmbd));
    dropout_ = register_module("dropout", nn::Dropout(o.dropout));
  }
  at::Tensor forward(const at::Tensor& x) { return dropout_(down_proj_(torch::silu(gate_proj_(x)) * up_proj_(x))); }

 private:
  AdaptableLinear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
  nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(LlamaMlp);

class LlamaLayerImpl : public nn::Module {
 public:
  explicit LlamaLayerImpl(const LlamaOptions& o) {
    self_attn_ = register_module("self_attn", LlamaAttention(o));
    mlp_ = register_module("mlp", LlamaMlp(o));
    input_layernorm_ = register_module("input_layernorm", RmsNorm(o.nEmbd, o.normEps));
    post_attention_layernorm_ = register_module("post_attention_layernorm", RmsNorm(o.nEmbd, o.normEps));
  }
  at::Tensor forward(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin) {
    x = x + self_attn_(input_layernorm_(x), cos, sin);
    return x + mlp_(post_attention_layernorm_(x));
  }
  at::Tensor decode(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const std::vector<KvCache*>& caches,
                    size_t layer, const DecodeRows& rows, int64_t capacity) {
    x = x + self_attn_->decode(input_layernorm_(x), cos, sin, caches, layer, rows, capacity);
    return x + mlp_(post_attention_layernorm_(x));
  }

 private:
  LlamaAttention self_attn_{nullptr};
  LlamaMlp mlp_{nullptr};
  RmsNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
};
TORCH_MODULE(LlamaLayer);

// Everything but the head, under the name "model" as Hugging Face's
// LlamaModel: of a part, only what it keeps, built as the GPT's (init_order.h).
class LlamaBodyImpl : public nn::Module {
 public:
  LlamaBodyImpl(const LlamaOptions& o, const ModelPart& part, std::vector<ParamShape>& built,
           std::map<std::string, at::Tensor>& constants) {
    auto unit = [&](const std::string& name, bool keep, auto make) {
      return buildUnit(*this, name, "model." + name + ".", keep, part, built, make);
    };
    embed_tokens = unit("embed_tokens", part.input || (part.output && o.tiedHead),
                        [&] { return nn::Embedding(o.vocabSize, o.nEmbd); });
    auto holder = std::make_shared<nn::Module>();
    buildBlocks(o.nLayer, part, "model.layers.", *holder, built, isRmsNorm, constants, layers, layerIndex,
                [&](int64_t) { return LlamaLayer(o); });
    register_module("layers", holder);
    norm = unit("norm", part.output, [&] { return RmsNorm(o.nEmbd, o.normEps); });
  }

  nn::Embedding embed_tokens{nullptr};
  std::vector<LlamaLayer> layers;
  std::vector<int64_t> layerIndex;
  RmsNorm norm{nullptr};
};
TORCH_MODULE(LlamaBody);

class Llama : public Model {
 public:
  Llama(const LlamaOptions& o, const ModelPart& part) : o_(o), part_(part) {
    std::vector<ParamShape> built;
    std::map<std::string, at::Tensor> constants;
    body_ = register_module("model", LlamaBody(o, part, built, constants));
    if (!o.tiedHead) {
      lm_head_ = buildUnit(*this, "lm_head", "lm_head.", part.output, part, built,
                           [&] { return nn::Linear(nn::LinearOptions(o.nEmbd, o.vocabSize).bias(false)); });
    }
    initializeInOrder(*this, std::move(built), part, "model.layers.", constants,
                      [](const std::string& name) { return isRmsNorm(name) ? -1.0 : 0.02; });
    std::tie(cos_, sin_) = rotaryTables(o);
  }

  // ZeRO stage 3 gathers one block at a time.
  std::vector<std::string> shardingUnits() const override {
    std::vector<std::string> units;
    for (int64_t i : body_->layerIndex) units.push_back(fmt::format("model.layers.{}", i));
    return units;
  }

  std::vector<std::pair<std::string, std::string>> tiedNames() const override {
    if (!part_.output || !o_.tiedHead) return {};
    return {{kLlamaHeadName, kLlamaEmbeddingName}};
  }

  bool decodes() const override { return true; }

  at::Tensor decode(const std::vector<at::Tensor>& rows, const std::vector<KvCache*>& caches) override {
    if (!part_.whole()) throw Error("llama: a part of the model (a pipeline stage) decodes with decodePart");
    return decodePart({}, rows, caches);
  }

  at::Tensor decodePart(const at::Tensor& hidden, const std::vector<at::Tensor>& rows,
                        const std::vector<KvCache*>& caches) override {
    const at::Device device = part_.input ? body_->embed_tokens->weight.device() : hidden.device();
    const DecodeRows batch = decodeRows(rows, caches, o_.blockSize, "llama", device);
    tables(device);
    // Each row's angles at its own positions: [B, 1, T, D].
    const at::Tensor cos = cos_.index({batch.positions}).unsqueeze(1);
    const at::Tensor sin = sin_.index({batch.positions}).unsqueeze(1);
    at::Tensor x;
    if (part_.input) {
      x = body_->embed_tokens(batch.tokens);
    } else {
      checkStageInput(hidden, batch, o_.nEmbd, "llama");
      x = hidden;
    }
    for (size_t i = 0; i < body_->layers.size(); ++i) {
      x = body_->layers[i]->decode(x, cos, sin, caches, i, batch, o_.blockSize);
    }
    if (!part_.output) {
      advanceCaches(batch, caches);
      return x;
    }
    return head(body_->norm(lastOfEachRow(x, batch, caches)));
  }

  at::Tensor forward(const at::Tensor& in) override {
    at::Tensor x;
    int64_t t = 0;
    if (part_.input) {
      if (in.dim() != 2) {
        throw DataError(fmt::format("llama: expected tokens [batch, time], got {} dimension(s)", in.dim()));
      }
      t = in.size(1);
      if (t > o_.blockSize) {
        throw DataError(fmt::format("llama: a sequence of {} tokens is longer than model.block_size ({})", t,
                                    o_.blockSize));
      }
      x = body_->embed_tokens(in);
    } else {
      // A later pipeline stage: the residual stream [B, T, n_embd].
      if (in.dim() != 3 || in.size(2) != o_.nEmbd) {
        throw DataError(fmt::format("llama: a stage from block {} expects activations [batch, time, {}], got [{}]",
                                    part_.firstBlock, o_.nEmbd, fmt::join(in.sizes(), ", ")));
      }
      x = in;
      t = in.size(1);
    }
    tables(x.device());
    const at::Tensor cos = cos_.narrow(0, 0, t), sin = sin_.narrow(0, 0, t);
    const bool again = o_.recompute && is_training();
    for (size_t i = 0; i < body_->layers.size(); ++i) {
      LlamaLayer layer = body_->layers[i];
      x = inUnit(static_cast<int>(i), [layer, again, cos, sin](const at::Tensor& y) mutable {
        auto f = [layer, cos, sin](const at::Tensor& z) mutable { return layer->forward(z, cos, sin); };
        return again ? recomputed(f, y) : f(y);
      }, x);
    }
    if (!part_.output) return x;
    return head(body_->norm(x));
  }

 private:
  at::Tensor head(const at::Tensor& x) {
    return o_.tiedHead ? models::linear(x, body_->embed_tokens->weight) : models::linear(x, lm_head_->weight);
  }
  // The angle tables on the device the model computes on.
  void tables(const at::Device& device) {
    if (cos_.device() == device) return;
    cos_ = cos_.to(device);
    sin_ = sin_.to(device);
  }

  LlamaOptions o_;
  ModelPart part_;
  LlamaBody body_{nullptr};
  nn::Linear lm_head_{nullptr};
  at::Tensor cos_, sin_;  // [block_size, head_dim], float32
};

}  // namespace

LlamaOptions llamaOptions(const ModelConfig& config, int64_t vocabSize) {
  LlamaOptions o;
  o.vocabSize = config.vocabSize > 0 ? config.vocabSize : vocabSize;
  o.blockSize = config.blockSize;
  o.nLayer = config.nLayer;
  o.nHead = config.nHead;
  o.nKvHead = kvHeads(config);
  o.nEmbd = config.nEmbd;
  o.intermediate = intermediateWidth(config);
  o.normEps = config.normEps > 0 ? config.normEps : 1e-5;
  o.tiedHead = config.tieEmbeddings;
  o.dropout = config.dropout;
  o.recompute = config.recompute == Recompute::blocks;
  o.rope = config.rope;
  return o;
}

at::Tensor ropeInverseFrequencies(int64_t headDim, const RopeConfig& rope) {
  at::Tensor inverse =
      1.0 / torch::pow(rope.theta, torch::arange(0, headDim, 2, torch::kLong).to(torch::kFloat) / headDim);
  switch (rope.scaling) {
    case RopeScaling::none: break;
    case RopeScaling::linear: inverse = inverse / rope.factor; break;
    case RopeScaling::llama3: {
      // Wavelengths longer than the trained context / low_freq_factor are
      // stretched by factor, shorter than context / high_freq_factor kept,
      // and those between blended linearly in context / wavelength.
      const double context = static_cast<double>(rope.originalContext);
      const at::Tensor wavelength = 2 * M_PI / inverse;
      const at::Tensor smooth =
          (context / wavelength - rope.lowFreqFactor) / (rope.highFreqFactor - rope.lowFreqFactor);
      const at::Tensor blended = (1 - smooth) * inverse / rope.factor + smooth * inverse;
      at::Tensor scaled = torch::where(wavelength > context / rope.lowFreqFactor, inverse / rope.factor, inverse);
      const at::Tensor between =
          (wavelength >= context / rope.highFreqFactor) & (wavelength <= context / rope.lowFreqFactor);
      inverse = torch::where(between, blended, scaled);
      break;
    }
  }
  return inverse;
}

void checkLlamaOptions(const LlamaOptions& o, const ModelPart& part) {
  for (const auto& [value, key] :
       {std::pair{o.vocabSize, "model.vocab_size"}, std::pair{o.blockSize, "model.block_size"},
        std::pair{o.nLayer, "model.n_layer"}, std::pair{o.nHead, "model.n_head"},
        std::pair{o.nKvHead, "model.n_kv_head"}, std::pair{o.nEmbd, "model.n_embd"},
        std::pair{o.intermediate, "model.intermediate_size"}}) {
    if (value < 1) throw ConfigError(fmt::format("{}: must be >= 1, got {}", key, value));
  }
  if (o.nEmbd % o.nHead != 0 || (o.nEmbd / o.nHead) % 2 != 0) {
    throw ConfigError(fmt::format("model.n_embd: {} must be model.n_head ({}) heads of an even width (the rotary "
                                  "embedding turns pairs of dimensions)",
                                  o.nEmbd, o.nHead));
  }
  if (o.nHead % o.nKvHead != 0) {
    throw ConfigError(fmt::format("model.n_kv_head: {} does not divide model.n_head ({}): each key/value head "
                                  "serves a group of query heads",
                                  o.nKvHead, o.nHead));
  }
  if (!(o.dropout >= 0 && o.dropout < 1)) {
    throw ConfigError(fmt::format("model.dropout: must be in [0, 1), got {}", o.dropout));
  }
  if (o.rope.scaling == RopeScaling::llama3 && !(o.rope.highFreqFactor > o.rope.lowFreqFactor)) {
    throw ConfigError(fmt::format("model.rope.high_freq_factor: {} must be above low_freq_factor ({})",
                                  o.rope.highFreqFactor, o.rope.lowFreqFactor));
  }
  const int64_t end = part.endBlock < 0 ? o.nLayer : part.endBlock;
  if (part.firstBlock < 0 || part.firstBlock >= end || end > o.nLayer) {
    throw ConfigError(fmt::format("llama: blocks [{}, {}) are not a part of a model of {} blocks (model.n_layer)",
                                  part.firstBlock, end, o.nLayer));
  }
}

std::shared_ptr<Model> createLlama(const LlamaOptions& o, const ModelPart& part) {
  checkLlamaOptions(o, part);
  return std::make_shared<Llama>(o, part);
}

}  // namespace cohort::models
