#include "cohort/models/gpt.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/models/linear.h"
#include "cohort/models/lora.h"
#include "models/attention.h"
#include "models/flash_attention.h"
#include "models/fused_ops.h"
#include "models/init_order.h"
#include "models/recompute.h"

namespace cohort::models {
namespace {

namespace nn = torch::nn;

// The layers model.lora may adapt.
AdaptableLinear linear(int64_t in, int64_t out, bool bias) {
  return AdaptableLinear(nn::LinearOptions(in, out).bias(bias));
}

// LayerNorm whose bias can be left out (GPT-2 has one; bias: false drops
// it, as nanoGPT allows), unlike torch::nn::LayerNorm.
class LayerNormImpl : public nn::Module {
 public:
  LayerNormImpl(int64_t n, bool bias) {
    weight_ = register_parameter("weight", torch::ones({n}));
    if (bias) bias_ = register_parameter("bias", torch::zeros({n}));
  }
  at::Tensor forward(const at::Tensor& x) {
    return torch::layer_norm(x, {weight_.size(0)}, weight_, bias_, 1e-5);
  }

 private:
  at::Tensor weight_, bias_;
};
TORCH_MODULE(LayerNorm);

class CausalSelfAttentionImpl : public nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptOptions& o) : heads_(o.nHead) {
    c_attn_ = register_module("c_attn", linear(o.nEmbd, 3 * o.nEmbd, o.bias));
    c_proj_ = register_module("c_proj", linear(o.nEmbd, o.nEmbd, o.bias));
    attnDropout_ = register_module("attn_dropout", nn::Dropout(o.dropout));
    residDropout_ = register_module("resid_dropout", nn::Dropout(o.dropout));
  }

  // x [B, T, C] -> [B, T, C]; position t attends to positions <= t.
  at::Tensor forward(const at::Tensor& x) {
    // Dropout only where it drops something: without it the attention
    // weights need not exist whole (models/flash_attention.h).
    std::function<at::Tensor(const at::Tensor&)> drop;
    if (is_training() && attnDropout_->options.p() > 0) drop = [this](const at::Tensor& a) { return attnDropout_(a); };
    const at::Tensor y = causalAttentionPacked(c_attn_(x), heads_, bias_, x.options(), drop);
    return residDropout_(c_proj_(y));
  }

  // x [B, T, C]: the rows of `rows` (attention.h), their earlier keys and
  // values in the caches at block `layer`.
  at::Tensor decode(const at::Tensor& x, const std::vector<KvCache*>& caches, size_t layer, const DecodeRows& rows,
                    int64_t capacity) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads_;
    const std::vector<at::Tensor> qkv = c_attn_(x).split(c, 2);
    auto split = [&](const at::Tensor& m) { return m.view({b, t, heads_, d}).transpose(1, 2); };
    return c_proj_(cachedAttention(split(qkv[0]), split(qkv[1]), split(qkv[2]), caches, layer, rows, capacity));
  }

 private:
  int64_t heads_;
  at::Tensor bias_;  // causalAttention's mask
  AdaptableLinear c_attn_{nullptr}, c_proj_{nullptr};
  nn::Dropout attnDropout_{nullptr}, residDropout_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public nn::Module {
 public:
  explicit MlpImpl(const GptOptions& o) : tanh_(o.geluTanh) {
    c_fc_ = register_module("c_fc", linear(o.nEmbd, 4 * o.nEmbd, o.bias));
    c_proj_ = register_module("c_proj", linear(4 * o.nEmbd, o.nEmbd, o.bias));
    dropout_ = register_module("dropout", nn::Dropout(o.dropout));
  }
  at::Tensor forward(const at::Tensor& x) {
    // GELU keeping its slope for the backward where fused ops are on
    // (models/fused_ops.h), else ATen's. Where the fused kernels take
    // c_fc's tensors, its bias is added in GELU's pass and its gradient
    // summed in GELU's backward pass, instead of a pass of each over the
    // [rows, 4 C] activations (the same sums: h + b, then GELU).
    const at::Tensor& b = c_fc_->bias;
    if (fusedOpsOn() && b.defined() && !c_fc_->adapted() && detail::fusedKernelsTake({x, c_fc_->weight, b})) {
      return dropout_(c_proj_(biasGelu(models::linear(x, c_fc_->weight), b, tanh_)));
    }
    const at::Tensor h = biasGelu(c_fc_(x), at::Tensor(), tanh_);
    return dropout_(c_proj_(h));
  }

 private:
  bool tanh_;
  AdaptableLinear c_fc_{nullptr}, c_proj_{nullptr};
  nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(Mlp);

class BlockImpl : public nn::Module {
 public:
  explicit BlockImpl(const GptOptions& o) {
    ln_1_ = register_module("ln_1", LayerNorm(o.nEmbd, o.bias));
    attn_ = register_module("attn", CausalSelfAttention(o));
    ln_2_ = register_module("ln_2", LayerNorm(o.nEmbd, o.bias));
    mlp_ = register_module("mlp", Mlp(o));
  }
  at::Tensor forward(at::Tensor x) {
    if (!fusedOpsOn()) {
      x = x + attn_(ln_1_(x));
      return x + mlp_(ln_2_(x));
    }
    // The residual add after attention and ln_2 in one pass
    // (models/fused_ops.h), ln_2's parameters looked up each time: they
    // are the module's, whatever replaced them.
    const auto ln2 = ln_2_->named_parameters(/*recurse=*/false);
    const at::Tensor* ln2Bias = ln2.find("bias");
    const AddNorm a = addLayerNorm(x, attn_(ln_1_(x)), ln2["weight"], ln2Bias ? *ln2Bias : at::Tensor(), 1e-5);
    return a.sum + mlp_(a.norm);
  }
  at::Tensor decode(at::Tensor x, const std::vector<KvCache*>& caches, size_t layer, const DecodeRows& rows,
                    int64_t capacity) {
    x = x + attn_->decode(ln_1_(x), caches, layer, rows, capacity);
    return x + mlp_(ln_2_(x));
  }

 private:
  LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(Block);

bool isNorm(const std::string& name) { return name.find(".ln_") != std::string::npos; }

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Everything but the head, under the name "transformer" as in GPT-2: of a
// part (ModelPart), only what it keeps. Every unit is built in the whole
// model's order whether kept or not (the random numbers their default
// initialization draws are drawn either way), one at a time; `built` lists
// every parameter of the whole model in order.
class TransformerImpl : public nn::Module {
 public:
  // With part.sink, the kept blocks' parameters are released as soon as a
  // block is built; `constants` keeps those the initialization below does
  // not draw (the LayerNorms').
  TransformerImpl(const GptOptions& o, const ModelPart& part, std::vector<ParamShape>& built,
                  std::map<std::string, at::Tensor>& constants) {
    auto unit = [&](const std::string& name, bool keep, auto make) {
      return buildUnit(*this, name, "transformer." + name + ".", keep, part, built, make);
    };
    wte = unit("wte", part.input || part.output, [&] { return nn::Embedding(o.vocabSize, o.nEmbd); });
    wpe = unit("wpe", part.input, [&] { return nn::Embedding(o.blockSize, o.nEmbd); });
    if (part.input) drop = register_module("drop", nn::Dropout(o.dropout));
    auto h = std::make_shared<nn::Module>();
    buildBlocks(o.nLayer, part, "transformer.h.", *h, built, isNorm, constants, blocks, blockIndex,
                [&](int64_t) { return Block(o); });
    register_module("h", h);
    ln_f = unit("ln_f", part.output, [&] { return LayerNorm(o.nEmbd, o.bias); });
  }

  nn::Embedding wte{nullptr}, wpe{nullptr};
  nn::Dropout drop{nullptr};
  std::vector<Block> blocks;       // the kept blocks, in order
  std::vector<int64_t> blockIndex;  // their index in the whole model
  LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Transformer);

class Gpt : public Model {
 public:
  Gpt(const GptOptions& o, const ModelPart& part)
      : blockSize_(o.blockSize), nEmbd_(o.nEmbd), recompute_(o.recompute), part_(part) {
    std::vector<ParamShape> built;
    std::map<std::string, at::Tensor> constants;
    transformer_ = register_module("transformer", Transformer(o, part, built, constants));
    // GPT-2's initialization over the whole model's parameters in order;
    // the projections into the residual stream are scaled down with depth.
    const double residualStd = 0.02 / std::sqrt(2.0 * static_cast<double>(o.nLayer));
    initializeInOrder(*this, std::move(built), part, "transformer.h.", constants, [&](const std::string& name) {
      if (isNorm(name)) return -1.0;  // ones and zeros already
      if (endsWith(name, ".bias")) return 0.0;
      return endsWith(name, "c_proj.weight") ? residualStd : 0.02;
    });
  }

  // ZeRO stage 3 gathers one block at a time.
  std::vector<std::string> shardingUnits() const override {
    std::vector<std::string> units;
    for (int64_t i : transformer_->blockIndex) units.push_back(fmt::format("transformer.h.{}", i));
    return units;
  }

  std::vector<std::pair<std::string, std::string>> tiedNames() const override {
    if (!part_.output) return {};
    return {{kTiedHeadName, "transformer.wte.weight"}};
  }

  bool decodes() const override { return true; }

  at::Tensor decode(const std::vector<at::Tensor>& rows, const std::vector<KvCache*>& caches) override {
    if (!part_.whole()) throw Error("gpt: a part of the model (a pipeline stage) decodes with decodePart");
    return decodePart({}, rows, caches);
  }

  at::Tensor decodePart(const at::Tensor& hidden, const std::vector<at::Tensor>& rows,
                        const std::vector<KvCache*>& caches) override {
    Transformer& tr = transformer_;
    const at::Device device = part_.input ? tr->wte->weight.device() : hidden.device();
    const DecodeRows batch = decodeRows(rows, caches, blockSize_, "gpt", device);
    at::Tensor x;
    if (part_.input) {
      x = tr->drop(tr->wte(batch.tokens) + tr->wpe(batch.positions));
    } else {
      checkStageInput(hidden, batch, nEmbd_, "gpt");
      x = hidden;
    }
    for (size_t i = 0; i < tr->blocks.size(); ++i) x = tr->blocks[i]->decode(x, caches, i, batch, blockSize_);
    if (!part_.output) {
      advanceCaches(batch, caches);
      return x;
    }
    x = lastOfEachRow(x, batch, caches);
    return models::linear(tr->ln_f(x), tr->wte->weight);
  }

  at::Tensor forward(const at::Tensor& in) override {
    Transformer& tr = transformer_;
    at::Tensor x;
    if (part_.input) {
      const at::Tensor& tokens = in;
      if (tokens.dim() != 2) {
        throw DataError(fmt::format("gpt: expected tokens [batch, time], got {} dimension(s)", tokens.dim()));
      }
      const int64_t t = tokens.size(1);
      if (t > blockSize_) {
        throw DataError(fmt::format("gpt: a sequence of {} tokens is longer than model.block_size ({})", t,
                                    blockSize_));
      }
      const at::Tensor positions = torch::arange(t, tokens.options().dtype(torch::kLong));
      x = tr->drop(tr->wte(tokens) + tr->wpe(positions));
    } else {
      // A later pipeline stage: the residual stream [B, T, n_embd].
      if (in.dim() != 3 || in.size(2) != nEmbd_) {
        throw DataError(fmt::format("gpt: a stage from block {} expects activations [batch, time, {}], "
                                    "got [{}]",
                                    part_.firstBlock, nEmbd_, fmt::join(in.sizes(), ", ")));
      }
      x = in;
    }
    for (size_t i = 0; i < tr->blocks.size(); ++i) {
      Block block = tr->blocks[i];
      const bool again = recompute_ && is_training();
      x = inUnit(static_cast<int>(i), [block, again](const at::Tensor& in) mutable {
        return again ? recomputed([block](const at::Tensor& y) mutable { return block->forward(y); }, in)
                     : block(in);
      }, x);
    }
    if (!part_.output) return x;
    x = tr->ln_f(x);
    // The head is the token embedding (weight tying).
    return models::linear(x, tr->wte->weight);
  }

 private:
  Transformer transformer_{nullptr};
  int64_t blockSize_;
  int64_t nEmbd_;
  bool recompute_;
  ModelPart part_;
};

}  // namespace

at::Tensor causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& mask,
                           const at::TensorOptions& maskOptions,
                           const std::function<at::Tensor(const at::Tensor&)>& dropAttention) {
  // Without dropout on the weights, blockwise where it applies (CPU,
  // float32 or float64): the same values up to rounding, without the
  // [B, H, T, T] scores.
  if (!dropAttention && flashAttentionApplies(q, k, v)) return flashAttention(q, k, v);
  // bfloat16 with the fused ops: blocks of queries, each against the keys
  // up to its end only.
  if (detail::causalBlocksApply(q)) return detail::causalBlocksAttention(q, k, v, dropAttention);
  const int64_t b = q.size(0), heads = q.size(1), t = q.size(2), d = q.size(3);
  if (!mask.defined() || mask.size(0) != t || mask.dtype() != maskOptions.dtype() ||
      mask.device() != maskOptions.device()) {
    mask = torch::full({t, t}, -std::numeric_limits<double>::infinity(),
                       torch::TensorOptions().dtype(maskOptions.dtype()).device(maskOptions.device()))
               .triu(1);
  }
  // Scale and causal mask in the product itself: baddbmm writes the mask
  // (0 at and below the diagonal, -inf above) and adds scale * q k^T into
  // it, one pass over the [B*H, T, T] scores where a product, a scaling
  // and a masked_fill take three, and three fewer in backward. The
  // values are those of (q k^T) * scale then masked_fill: the scale
  // multiplies each finished dot product, and 0 + x = x, -inf + x = -inf.
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  at::Tensor att = at::baddbmm(mask, q.reshape({b * heads, t, d}), k.reshape({b * heads, t, d}).transpose(1, 2),
                               /*beta=*/1, /*alpha=*/scale)
                       .view({b, heads, t, t});
  // Each row over the keys it sees only (models/fused_ops.h), where the
  // fused ops take the scores: bfloat16, under autocast.
  att = causalSoftmax(att);
  if (dropAttention) att = dropAttention(att);
  return torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, heads * d});
}

at::Tensor causalAttentionPacked(const at::Tensor& qkv, int64_t heads, at::Tensor& mask,
                                 const at::TensorOptions& maskOptions,
                                 const std::function<at::Tensor(const at::Tensor&)>& dropAttention) {
  if (!dropAttention && flashAttentionPackedApplies(qkv, heads)) return flashAttentionPacked(qkv, heads);
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  const std::vector<at::Tensor> parts = qkv.split(c, 2);
  auto split = [&](const at::Tensor& m) { return m.reshape({b, t, heads, c / heads}).transpose(1, 2); };
  return causalAttention(split(parts[0]), split(parts[1]), split(parts[2]), mask, maskOptions, dropAttention);
}

namespace detail {

bool causalBlocksApply(const at::Tensor& q) {
  return fusedOpsOn() && q.device().is_cpu() && q.scalar_type() == at::kBFloat16 && q.dim() == 4 &&
         q.size(2) > kCausalQueryBlock;
}

at::Tensor causalBlocksAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::function<at::Tensor(const at::Tensor&)>& dropAttention) {
  const int64_t b = q.size(0), heads = q.size(1), t = q.size(2), d = q.size(3);
  // [B H, T, D], contiguous once: each block a view of them. The scale on
  // the queries, a [T, D] pass, rather than on the [T, T] scores.
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const at::Tensor qs = (q * scale).reshape({b * heads, t, d});
  const at::Tensor ks = k.reshape({b * heads, t, d}), vs = v.reshape({b * heads, t, d});
  std::vector<at::Tensor> out;
  for (int64_t start = 0; start < t; start += kCausalQueryBlock) {
    const int64_t end = std::min(t, start + kCausalQueryBlock);
    // Queries [start, end) see keys [0, end): scores [B H, end - start, end].
    const at::Tensor scores = at::bmm(qs.narrow(1, start, end - start), ks.narrow(1, 0, end).transpose(1, 2));
    at::Tensor att = causalSoftmax(scores);
    if (dropAttention) att = dropAttention(att);
    out.push_back(at::bmm(att, vs.narrow(1, 0, end)));
  }
  return at::cat(out, 1).view({b, heads, t, d}).transpose(1, 2).contiguous().view({b, t, heads * d});
}

}  // namespace detail

GptOptions gptOptions(const ModelConfig& config, int64_t vocabSize) {
  GptOptions o;
  o.vocabSize = config.vocabSize > 0 ? config.vocabSize : vocabSize;
  o.blockSize = config.blockSize;
  o.nLayer = config.nLayer;
  o.nHead = config.nHead;
  o.nEmbd = config.nEmbd;
  o.dropout = config.dropout;
  o.bias = config.bias;
  o.geluTanh = config.activation == Activation::geluTanh;
  o.recompute = config.recompute == Recompute::blocks;
  return o;
}

std::shared_ptr<Model> createGpt(const GptOptions& o, const ModelPart& part) {
  for (const auto& [value, key] : {std::pair{o.vocabSize, "model.vocab_size"}, std::pair{o.blockSize, "model.block_size"},
                                   std::pair{o.nLayer, "model.n_layer"}, std::pair{o.nHead, "model.n_head"},
                                   std::pair{o.nEmbd, "model.n_embd"}}) {
    if (value < 1) throw ConfigError(fmt::format("{}: must be >= 1, got {}", key, value));
  }
  if (o.nEmbd % o.nHead != 0) {
    throw ConfigError(fmt::format("model.n_embd: {} is not divisible by model.n_head ({})", o.nEmbd, o.nHead));
  }
  if (!(o.dropout >= 0 && o.dropout < 1)) {
    throw ConfigError(fmt::format("model.dropout: must be in [0, 1), got {}", o.dropout));
  }
  const int64_t end = part.endBlock < 0 ? o.nLayer : part.endBlock;
  if (part.firstBlock < 0 || part.firstBlock >= end || end > o.nLayer) {
    throw ConfigError(fmt::format("gpt: blocks [{}, {}) are not a part of a model of {} blocks "
                                  "(model.n_layer)",
                                  part.firstBlock, end, o.nLayer));
  }
  return std::make_shared<Gpt>(o, part);
}

}  // namespace cohort::models
