#include "cohort/models/gpt.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/models/lora.h"
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
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads_;
    const std::vector<at::Tensor> qkv = c_attn_(x).split(c, 2);
    auto split = [&](const at::Tensor& m) { return m.view({b, t, heads_, d}).transpose(1, 2); };
    const at::Tensor y = causalAttention(split(qkv[0]), split(qkv[1]), split(qkv[2]), bias_, x.options(),
                                         [this](const at::Tensor& a) { return attnDropout_(a); });
    return residDropout_(c_proj_(y));
  }

  // x [B, T, C]: row r's first counts[r] positions are its new tokens, at
  // positions lengths[r] .., the rest padding; its earlier keys and values
  // are in caches[r] (block `layer`, capacity `capacity`), where the new
  // ones are written first. Rows of several lengths: their keys padded to
  // the longest, the padding masked out.
  at::Tensor decode(const at::Tensor& x, const std::vector<KvCache*>& caches, size_t layer,
                    const std::vector<int64_t>& lengths, const std::vector<int64_t>& counts, int64_t capacity) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads_;
    const std::vector<at::Tensor> qkv = c_attn_(x).split(c, 2);
    auto split = [&](const at::Tensor& m) { return m.view({b, t, heads_, d}).transpose(1, 2); };
    const at::Tensor q = split(qkv[0]), k = split(qkv[1]), v = split(qkv[2]);
    int64_t longest = 0;
    bool ragged = false;
    for (int64_t r = 0; r < b; ++r) {
      KvCache& kc = *caches[static_cast<size_t>(r)];
      if (kc.keys.size() <= layer) {
        kc.keys.push_back(torch::zeros({heads_, capacity, d}, k.options()));
        kc.values.push_back(torch::zeros({heads_, capacity, d}, v.options()));
      }
      kc.keys[layer].narrow(1, lengths[r], counts[r]).copy_(k[r].narrow(1, 0, counts[r]));
      kc.values[layer].narrow(1, lengths[r], counts[r]).copy_(v[r].narrow(1, 0, counts[r]));
      ragged = ragged || (r > 0 && lengths[r] + counts[r] != longest);
      longest = std::max(longest, lengths[r] + counts[r]);
    }
    at::Tensor keys, values;
    if (b == 1) {
      keys = caches[0]->keys[layer].narrow(1, 0, longest).unsqueeze(0);
      values = caches[0]->values[layer].narrow(1, 0, longest).unsqueeze(0);
    } else {
      keys = torch::zeros({b, heads_, longest, d}, k.options());
      values = torch::zeros({b, heads_, longest, d}, v.options());
      for (int64_t r = 0; r < b; ++r) {
        const KvCache& kc = *caches[static_cast<size_t>(r)];
        const int64_t n = lengths[r] + counts[r];
        keys[r].narrow(1, 0, n).copy_(kc.keys[layer].narrow(1, 0, n));
        values[r].narrow(1, 0, n).copy_(kc.values[layer].narrow(1, 0, n));
      }
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    at::Tensor att = torch::matmul(q, keys.transpose(2, 3)) * scale;  // [B, H, T, longest]
    if (t > 1 || ragged) {
      // Query i of row r is at position lengths[r] + i and sees keys j up to
      // it, and none of another row's padding.
      auto column = [&](const std::vector<int64_t>& values) {
        return torch::tensor(values, torch::kLong).view({b, 1, 1});
      };
      const at::Tensor j = torch::arange(longest, torch::kLong).view({1, 1, longest});
      std::vector<int64_t> ends(static_cast<size_t>(b));
      for (int64_t r = 0; r < b; ++r) ends[static_cast<size_t>(r)] = lengths[r] + counts[r];
      const at::Tensor at_ = column(lengths) + torch::arange(t, torch::kLong).view({1, t, 1});
      const at::Tensor hidden = ((j > at_) | (j >= column(ends))).unsqueeze(1).to(att.device());
      att = att.masked_fill(hidden, -std::numeric_limits<double>::infinity());
    }
    att = torch::softmax(att, -1);
    const at::Tensor y = torch::matmul(att, values).transpose(1, 2).contiguous().view({b, t, c});
    return c_proj_(y);
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
  explicit MlpImpl(const GptOptions& o) : approximate_(o.geluTanh ? "tanh" : "none") {
    c_fc_ = register_module("c_fc", linear(o.nEmbd, 4 * o.nEmbd, o.bias));
    c_proj_ = register_module("c_proj", linear(4 * o.nEmbd, o.nEmbd, o.bias));
    dropout_ = register_module("dropout", nn::Dropout(o.dropout));
  }
  at::Tensor forward(const at::Tensor& x) { return dropout_(c_proj_(torch::gelu(c_fc_(x), approximate_))); }

 private:
  const char* approximate_;
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
    x = x + attn_(ln_1_(x));
    return x + mlp_(ln_2_(x));
  }
  at::Tensor decode(at::Tensor x, const std::vector<KvCache*>& caches, size_t layer,
                    const std::vector<int64_t>& lengths, const std::vector<int64_t>& counts, int64_t capacity) {
    x = x + attn_->decode(ln_1_(x), caches, layer, lengths, counts, capacity);
    return x + mlp_(ln_2_(x));
  }

 private:
  LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(Block);

// A parameter of the whole model as built, for GPT-2's initialization of
// the parts a process does not keep.
struct ParamShape {
  std::string name;
  std::vector<int64_t> sizes;
};

void recordShapes(const nn::Module& unit, const std::string& prefix, std::vector<ParamShape>& out) {
  for (const auto& p : unit.named_parameters()) out.push_back({prefix + p.key(), p.value().sizes().vec()});
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
    const bool exact = part.exact;
    auto unit = [&](const std::string& name, bool keep, auto make) {
      if (!keep && !exact) return decltype(make())(nullptr);
      auto m = make();
      recordShapes(*m, "transformer." + name + ".", built);
      return keep ? register_module(name, m) : decltype(m)(nullptr);
    };
    wte = unit("wte", part.input || part.output, [&] { return nn::Embedding(o.vocabSize, o.nEmbd); });
    wpe = unit("wpe", part.input, [&] { return nn::Embedding(o.blockSize, o.nEmbd); });
    if (part.input) drop = register_module("drop", nn::Dropout(o.dropout));
    // h.<i> as nn.ModuleList names them, whichever blocks are kept.
    auto h = std::make_shared<nn::Module>();
    for (int64_t i = 0; i < o.nLayer; ++i) {
      const bool keep = part.holds(i, o.nLayer);
      if (!keep && !exact) continue;
      Block block(o);
      if (exact) recordShapes(*block, fmt::format("transformer.h.{}.", i), built);
      if (!keep) continue;  // dropped here, before the next block is built
      if (part.sink != nullptr) {
        for (const auto& p : block->named_parameters()) {
          const std::string name = fmt::format("transformer.h.{}.{}", i, p.key());
          if (name.find(".ln_") != std::string::npos) constants.emplace(name, p.value().detach().clone());
          releaseStorage(p.value());
        }
      }
      blocks.push_back(h->register_module(std::to_string(i), block));
      blockIndex.push_back(i);
    }
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

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

class Gpt : public Model {
 public:
  Gpt(const GptOptions& o, const ModelPart& part)
      : blockSize_(o.blockSize), nEmbd_(o.nEmbd), recompute_(o.recompute), part_(part) {
    std::vector<ParamShape> built;
    std::map<std::string, at::Tensor> constants;
    transformer_ = register_module("transformer", Transformer(o, part, built, constants));
    // GPT-2's initialization over the whole model's parameters in order;
    // the projections into the residual stream are scaled down with depth.
    // What this part does not keep is drawn into a scratch tensor of the
    // same shape, so the kept tensors get the whole model's values.
    torch::NoGradGuard noGrad;
    const double residualStd = 0.02 / std::sqrt(2.0 * static_cast<double>(o.nLayer));
    std::map<std::string, at::Tensor> kept;
    for (auto& item : named_parameters()) kept.emplace(item.key(), item.value());
    if (!part.exact) {
      built.clear();
      for (auto& [name, t] : kept) built.push_back({name, t.sizes().vec()});
    }
    // With a sink, each kept block's values are made here, in the same
    // order and from the same draws, handed over whole and dropped.
    std::string unit;
    ckpt::StateDict values;
    auto handOver = [&] {
      if (!values.empty()) part.sink->take(unit, std::move(values));
      values.clear();
    };
    for (const ParamShape& p : built) {
      const std::string& name = p.name;
      auto it = kept.find(name);
      const bool streamed = part.sink != nullptr && it != kept.end() && name.rfind("transformer.h.", 0) == 0;
      at::Tensor value = streamed ? at::Tensor() : (it != kept.end() ? it->second : at::Tensor());
      if (streamed && !part.sink->wantsValues()) continue;
      if (streamed) {
        const std::string of = name.substr(0, name.find('.', std::string("transformer.h.").size()));
        if (of != unit) handOver();
        unit = of;
      }
      if (name.find(".ln_") != std::string::npos) {  // ones and zeros already
        if (streamed) values.emplace_back(name, constants.at(name));
        continue;
      }
      if (streamed) {
        value = at::empty(p.sizes);
        values.emplace_back(name, value);
      }
      if (endsWith(name, ".bias")) {
        if (value.defined()) value.zero_();
        continue;
      }
      const double std = endsWith(name, "c_proj.weight") ? residualStd : 0.02;
      if (value.defined()) {
        value.normal_(0.0, std);
      } else {
        at::empty(p.sizes).normal_(0.0, std);
      }
    }
    if (part.sink != nullptr && part.sink->wantsValues()) handOver();
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

  bool decodes() const override { return part_.whole(); }

  at::Tensor decode(const std::vector<at::Tensor>& rows, const std::vector<KvCache*>& caches) override {
    if (!part_.whole()) throw Error("gpt: a part of the model (a pipeline stage) cannot decode");
    if (rows.empty() || rows.size() != caches.size()) {
      throw DataError(fmt::format("gpt: decode takes a cache per row; got {} row(s) and {} cache(s)", rows.size(),
                                  caches.size()));
    }
    const int64_t b = static_cast<int64_t>(rows.size());
    std::vector<int64_t> lengths, counts;
    int64_t t = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const at::Tensor& row = rows[r];
      if (row.dim() != 1 || row.size(0) < 1 || row.scalar_type() != torch::kLong) {
        throw DataError(fmt::format("gpt: decode takes rows of token ids int64 [time >= 1]; row {} is {} [{}]", r,
                                    c10::toString(row.scalar_type()), fmt::join(row.sizes(), ", ")));
      }
      const int64_t length = caches[r]->length, count = row.size(0);
      if (length + count > blockSize_) {
        throw DataError(fmt::format("gpt: {} cached positions and {} new ones pass model.block_size ({})", length,
                                    count, blockSize_));
      }
      lengths.push_back(length);
      counts.push_back(count);
      t = std::max(t, count);
    }
    // Rows padded to the longest with token 0 at positions that stay inside
    // the embedding: their outputs are never read.
    at::Tensor tokens = torch::zeros({b, t}, torch::kLong);
    at::Tensor positions = torch::zeros({b, t}, torch::kLong);
    for (int64_t r = 0; r < b; ++r) {
      tokens[r].narrow(0, 0, counts[r]).copy_(rows[static_cast<size_t>(r)]);
      positions[r].copy_(torch::arange(lengths[r], lengths[r] + t, torch::kLong).clamp_max(blockSize_ - 1));
    }
    Transformer& tr = transformer_;
    const auto device = tr->wte->weight.device();
    tokens = tokens.to(device);
    positions = positions.to(device);
    at::Tensor x = tr->drop(tr->wte(tokens) + tr->wpe(positions));
    for (size_t i = 0; i < tr->blocks.size(); ++i) {
      x = tr->blocks[i]->decode(x, caches, i, lengths, counts, blockSize_);
    }
    std::vector<int64_t> last(counts.size());
    for (size_t r = 0; r < counts.size(); ++r) {
      caches[r]->length += counts[r];
      last[r] = counts[r] - 1;
    }
    x = x.index({torch::arange(b, torch::kLong).to(device), torch::tensor(last, torch::kLong).to(device)});
    return torch::linear(tr->ln_f(x), tr->wte->weight);
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
    return torch::linear(x, tr->wte->weight);
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
  att = torch::softmax(att, -1);
  if (dropAttention) att = dropAttention(att);
  return torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, heads * d});
}

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
