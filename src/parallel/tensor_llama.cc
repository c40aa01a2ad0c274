// The Llama decoder split over a tensor group (parallel/tensor_llama.h):
// its modules, and the build that draws the whole model's numbers in its
// order (models/llama.cc) keeping only this rank's slices.

#include "cohort/models/linear.h"
#include "cohort/parallel/tensor_llama.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "cohort/parallel/tensor_layers.h"
#include "models/llama_parts.h"
#include "parallel/detail/split_decoder.h"

namespace cohort::parallel {
namespace {

namespace nn = torch::nn;

// The column-parallel layers' input (whole, or gathered from the
// sequence's slices) and the row-parallel layers' output (summed, or
// reduce-scattered into the sequence's slices).
struct SliceIo {
  const comm::Comm* group;
  bool sequence;
  at::Tensor in(const at::Tensor& x) const { return sequence ? gatherSequence(x, 1, *group) : copyToSlices(x, *group); }
  at::Tensor out(RowParallelLinear& layer, const at::Tensor& y) const {
    return sequence ? layer->forwardScattered(y, 1) : layer(y);
  }
};

class SplitLlamaAttentionImpl : public nn::Module {
 public:
  SplitLlamaAttentionImpl(ColumnParallelLinear q, ColumnParallelLinear k, ColumnParallelLinear v, RowParallelLinear o,
                          int64_t heads, int64_t kvHeads)
      : heads_(heads),
        kvHeads_(kvHeads),
        q_(register_module("q_proj", std::move(q))),
        k_(register_module("k_proj", std::move(k))),
        v_(register_module("v_proj", std::move(v))),
        o_(register_module("o_proj", std::move(o))) {}

  // x: the residual region's (whole, or this rank's slice of the
  // sequence); cos, sin [S, D] of the whole sequence's positions. This
  // rank's query heads read its key/value heads: one input, one sum.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const SliceIo& ex) {
    const at::Tensor in = ex.in(x);
    const int64_t b = in.size(0), s = in.size(1), d = q_->weight.size(0) / heads_;
    auto heads = [&](const ColumnParallelLinear& l, int64_t n) {
      return models::linear(in, l->weight).view({b, s, n, d}).transpose(1, 2);
    };
    const at::Tensor q = models::rotate(heads(q_, heads_), cos, sin);
    const at::Tensor k = models::rotate(heads(k_, kvHeads_), cos, sin);
    const at::Tensor y = models::causalAttention(q, models::widenHeads(k, heads_),
                                                 models::widenHeads(heads(v_, kvHeads_), heads_), mask_, x.options());
    return ex.out(o_, y);
  }

 private:
  int64_t heads_, kvHeads_;  // this rank's
  at::Tensor mask_;
  ColumnParallelLinear q_, k_, v_;
  RowParallelLinear o_;
};
TORCH_MODULE(SplitLlamaAttention);

class SplitLlamaMlpImpl : public nn::Module {
 public:
  SplitLlamaMlpImpl(ColumnParallelLinear gate, ColumnParallelLinear up, RowParallelLinear down)
      : gate_(register_module("gate_proj", std::move(gate))),
        up_(register_module("up_proj", std::move(up))),
        down_(register_module("down_proj", std::move(down))) {}
  at::Tensor forward(const at::Tensor& x, const SliceIo& ex) {
    const at::Tensor in = ex.in(x);
    return ex.out(down_, torch::silu(models::linear(in, gate_->weight)) * models::linear(in, up_->weight));
  }

 private:
  ColumnParallelLinear gate_, up_;
  RowParallelLinear down_;
};
TORCH_MODULE(SplitLlamaMlp);

class SplitLlamaLayerImpl : public nn::Module {
 public:
  SplitLlamaLayerImpl(SplitLlamaAttention attn, SplitLlamaMlp mlp, int64_t width, double eps)
      // In the whole model's order, which the state dict follows.
      : attn_(register_module("self_attn", std::move(attn))),
        mlp_(register_module("mlp", std::move(mlp))),
        norm1_(register_module("input_layernorm", models::RmsNorm(width, eps))),
        norm2_(register_module("post_attention_layernorm", models::RmsNorm(width, eps))) {}
  at::Tensor forward(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const SliceIo& ex) {
    x = x + attn_->forward(norm1_(x), cos, sin, ex);
    return x + mlp_->forward(norm2_(x), ex);
  }

 private:
  SplitLlamaAttention attn_;
  SplitLlamaMlp mlp_;
  models::RmsNorm norm1_, norm2_;
};
TORCH_MODULE(SplitLlamaLayer);

class SplitLlama : public detail::SplitDecoder {
 public:
  SplitLlama(const models::LlamaOptions& o, const comm::Comm& group, const TensorSplitOptions& split,
             const detail::Generator& gen, const models::ModelPart& part)
      : SplitDecoder(group, part, split, gen, o.vocabSize, o.blockSize, o.nEmbd, o.recompute, "llama",
                     "model.layers."),
        nLayer_(o.nLayer),
        tied_(o.tiedHead) {
    const int t = group.worldSize;
    const int64_t c = o.nEmbd, v = o.vocabSize, d = o.nEmbd / o.nHead, q = o.nHead * d, kv = o.nKvHead * d,
                  inter = o.intermediate;
    // The whole model's construction draws (nn::Embedding's and each
    // nn::Linear's defaults, in build order), then normal(0, 0.02) over
    // every weight in the same order (models/llama.cc).
    const std::vector<std::pair<const char*, std::vector<int64_t>>> shapes = {
        {"self_attn.q_proj.weight", {q, c}},      {"self_attn.k_proj.weight", {kv, c}},
        {"self_attn.v_proj.weight", {kv, c}},     {"self_attn.o_proj.weight", {c, q}},
        {"mlp.gate_proj.weight", {inter, c}},     {"mlp.up_proj.weight", {inter, c}},
        {"mlp.down_proj.weight", {c, inter}}};
    detail::drawEmbeddingDefaults(v, c, gen);
    for (int64_t i = 0; i < o.nLayer; ++i) {
      for (const auto& [name, sizes] : shapes) detail::drawLinearDefaults(sizes[1], sizes[0], false, gen);
    }
    if (!o.tiedHead) detail::drawLinearDefaults(c, v, false, gen);

    auto body = register_module("model", std::make_shared<nn::Module>());
    at::Tensor embed = slice(models::kLlamaEmbeddingName, {v, c}, 0.02, part.input || (part.output && o.tiedHead));
    if (embed.defined()) {
      embed_ = body->register_module("embed_tokens", VocabParallelEmbedding(embed, vocabFirst_, group_));
    }
    auto holder = body->register_module("layers", std::make_shared<nn::Module>());
    for (int64_t i = 0; i < o.nLayer; ++i) {
      const bool held = part.holds(i, o.nLayer);
      std::vector<at::Tensor> w;
      for (const auto& [name, sizes] : shapes) {
        w.push_back(slice(fmt::format("model.layers.{}.{}", i, name), sizes, 0.02, held));
      }
      if (!held) continue;
      auto column = [&](size_t k) { return ColumnParallelLinear(w[k], at::Tensor(), group_); };
      auto row = [&](size_t k) { return RowParallelLinear(w[k], at::Tensor(), group_); };
      SplitLlamaAttention attn(column(0), column(1), column(2), row(3), o.nHead / t, o.nKvHead / t);
      SplitLlamaMlp mlp(column(4), column(5), row(6));
      layers_.push_back(holder->register_module(std::to_string(i), SplitLlamaLayer(attn, mlp, c, o.normEps)));
      blockIndex_.push_back(i);
    }
    if (part.output) norm_ = body->register_module("norm", models::RmsNorm(c, o.normEps));
    if (!o.tiedHead) {
      at::Tensor head = slice(models::kLlamaHeadName, {v, c}, 0.02, part.output);
      if (head.defined()) head_ = register_module("lm_head", detail::Holder(head));
    }
    std::tie(cos_, sin_) = models::rotaryTables(o);
  }

  at::Tensor forward(const at::Tensor& in) override {
    const int64_t s = checkInput(in);
    const SliceIo ex{&group_, sequence_};
    at::Tensor x = !part_.input ? in : sequence_ ? embed_->forwardScattered(in, 1) : embed_(in);
    if (cos_.device() != x.device()) {
      cos_ = cos_.to(x.device());
      sin_ = sin_.to(x.device());
    }
    // The whole sequence's angles: attention sees it whole.
    const at::Tensor cos = cos_.narrow(0, 0, s), sin = sin_.narrow(0, 0, s);
    x = runBlocks(x, [this, cos, sin, ex](size_t k, const at::Tensor& y) { return layers_[k]->forward(y, cos, sin, ex); });
    if (!part_.output) return x;
    return head(norm_(x), tied_ ? embed_->weight : head_->weight);
  }

  std::vector<std::pair<std::string, std::string>> tiedNames() const override {
    if (!part_.output || !tied_) return {};
    return {{models::kLlamaHeadName, models::kLlamaEmbeddingName}};
  }

  std::vector<std::pair<std::string, TensorCut>> wholeCuts() const override {
    std::vector<std::string> names{models::kLlamaEmbeddingName};
    for (int64_t i = 0; i < nLayer_; ++i) {
      for (const char* name : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                               "mlp.down_proj.weight"}) {
        names.push_back(fmt::format("model.layers.{}.{}", i, name));
      }
    }
    if (!tied_) names.emplace_back(models::kLlamaHeadName);
    return splitOf(names);
  }

 private:
  int64_t nLayer_;
  bool tied_;
  VocabParallelEmbedding embed_{nullptr};
  std::vector<SplitLlamaLayer> layers_;
  models::RmsNorm norm_{nullptr};
  detail::Holder head_{nullptr};
  at::Tensor cos_, sin_;  // [block_size, head_dim], float32
};

}  // namespace

void checkLlamaTensorSplit(const models::LlamaOptions& o, int tensors) {
  if (tensors < 1) throw ConfigError(fmt::format("tensor parallelism needs at least 1 rank, got {}", tensors));
  for (const auto& [value, what] : {std::pair{o.nKvHead, "model.n_kv_head"},
                                    std::pair{o.intermediate, "model.intermediate_size"},
                                    std::pair{o.vocabSize, "model.vocab_size"}}) {
    if (value % tensors != 0) {
      throw ConfigError(fmt::format("distribution.tensor: {} ranks cannot split the model: {} ({}) is not divisible "
                                    "by {}",
                                    tensors, what, value, tensors));
    }
  }
  if (o.dropout != 0) {
    throw ConfigError(fmt::format("model.dropout: {} with tensor parallelism; only 0 is supported so far", o.dropout));
  }
}

std::shared_ptr<TensorParallelModel> createTensorParallelLlama(const models::LlamaOptions& o, const comm::Comm& group,
                                                               TensorSplitOptions split,
                                                               c10::optional<at::Generator> generator,
                                                               const models::ModelPart& part) {
  models::checkLlamaOptions(o, part);
  checkLlamaTensorSplit(o, group.worldSize);
  torch::NoGradGuard noGrad;
  auto model = std::make_shared<SplitLlama>(o, group, split, generator, part);
  model->startExchanges(split);
  return model;
}

}  // namespace cohort::parallel
