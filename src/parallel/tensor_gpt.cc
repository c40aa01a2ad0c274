// The GPT split over a tensor group (parallel/tensor_gpt.h): its modules,
// and the build that gives each rank its slices of the whole model's
// values without any rank holding a whole split matrix.

#include "cohort/parallel/tensor_gpt.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/models/fused_ops.h"
#include "cohort/parallel/tensor_layers.h"
#include "parallel/detail/split_decoder.h"

namespace cohort::parallel {
namespace {

namespace nn = torch::nn;

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// ---- The split model's modules -------------------------------------------

// The GPT's LayerNorm (models/gpt.cc): ones and zeros, the bias optional.
class NormImpl : public nn::Module {
 public:
  NormImpl(int64_t n, bool bias) {
    weight_ = register_parameter("weight", at::ones({n}));
    if (bias) bias_ = register_parameter("bias", at::zeros({n}));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::layer_norm(x, {weight_.size(0)}, weight_, bias_, 1e-5); }
  // x + delta and this LayerNorm of it, as the whole model's block takes
  // them (fused where fused ops are on, cohort/models/fused_ops.h).
  models::AddNorm addThenNorm(const at::Tensor& x, const at::Tensor& delta) {
    return models::addLayerNorm(x, delta, weight_, bias_, 1e-5);
  }

 private:
  at::Tensor weight_, bias_;
};
TORCH_MODULE(Norm);

class AttentionImpl : public nn::Module {
 public:
  AttentionImpl(ColumnParallelLinear qkv, RowParallelLinear proj, int64_t heads)
      : heads_(heads), qkv_(register_module("c_attn", std::move(qkv))), proj_(register_module("c_proj", std::move(proj))) {}

  // x [B, S, C] whole -> [B, S, C] whole: this rank's heads, then one sum.
  // `sequence`: x and the result are this rank's slice of the sequence.
  at::Tensor forward(const at::Tensor& x, bool sequence) {
    const at::Tensor all = sequence ? qkv_->forwardGathered(x, 1) : qkv_(x);
    const at::Tensor y = models::causalAttentionPacked(all, heads_, mask_, x.options());
    return sequence ? proj_->forwardScattered(y, 1) : proj_(y);
  }

 private:
  int64_t heads_;  // this rank's
  at::Tensor mask_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
};
TORCH_MODULE(Attention);

class MlpImpl : public nn::Module {
 public:
  MlpImpl(ColumnParallelLinear fc, RowParallelLinear proj, bool tanh)
      : tanh_(tanh),
        fc_(register_module("c_fc", std::move(fc))),
        proj_(register_module("c_proj", std::move(proj))) {}
  at::Tensor forward(const at::Tensor& x, bool sequence) {
    // As the whole GPT's MLP (models/gpt.cc): GELU keeping its slope where fused ops are on.
    if (sequence) return proj_->forwardScattered(models::biasGelu(fc_->forwardGathered(x, 1), {}, tanh_), 1);
    return proj_(models::biasGelu(fc_(x), {}, tanh_));
  }

 private:
  bool tanh_;
  ColumnParallelLinear fc_;
  RowParallelLinear proj_;
};
TORCH_MODULE(Mlp);

class BlockImpl : public nn::Module {
 public:
  BlockImpl(Norm ln1, Attention attn, Norm ln2, Mlp mlp)
      : ln1_(register_module("ln_1", std::move(ln1))),
        attn_(register_module("attn", std::move(attn))),
        ln2_(register_module("ln_2", std::move(ln2))),
        mlp_(register_module("mlp", std::move(mlp))) {}
  at::Tensor forward(at::Tensor x, bool sequence) {
    if (!models::fusedOpsOn()) {
      x = x + attn_->forward(ln1_(x), sequence);
      return x + mlp_->forward(ln2_(x), sequence);
    }
    // The residual add after attention and ln_2 in one pass, as the whole
    // model's block (models/gpt.cc) does.
    const models::AddNorm a = ln2_->addThenNorm(x, attn_->forward(ln1_(x), sequence));
    return a.sum + mlp_->forward(a.norm, sequence);
  }

 private:
  // In the whole model's order, which registration (and the state dict) follows.
  Norm ln1_;
  Attention attn_;
  Norm ln2_;
  Mlp mlp_;
};
TORCH_MODULE(Block);

class SplitGpt : public detail::SplitDecoder {
 public:
  SplitGpt(const models::GptOptions& o, const comm::Comm& group, const TensorSplitOptions& split,
           const detail::Generator& gen, const models::ModelPart& part)
      : SplitDecoder(group, part, split, gen, o.vocabSize, o.blockSize, o.nEmbd, o.recompute, "gpt",
                     "transformer.h."),
        layers_(o.nLayer),
        bias_(o.bias) {
    const int t = group.worldSize;
    const int64_t c = o.nEmbd, v = o.vocabSize;
    // The whole model's construction draws (each module's default
    // initialization), then GPT-2's initialization over every parameter in
    // order (models/gpt.cc): the same numbers, in the same order.
    detail::drawEmbeddingDefaults(v, c, gen);
    detail::drawEmbeddingDefaults(o.blockSize, c, gen);
    for (int64_t i = 0; i < o.nLayer; ++i) {
      detail::drawLinearDefaults(c, 3 * c, o.bias, gen);
      detail::drawLinearDefaults(c, c, o.bias, gen);
      detail::drawLinearDefaults(c, 4 * c, o.bias, gen);
      detail::drawLinearDefaults(4 * c, c, o.bias, gen);
    }
    const double residualStd = 0.02 / std::sqrt(2.0 * static_cast<double>(o.nLayer));
    // This rank's slice of the whole model's tensor `name` of `sizes`; a
    // tensor of another pipeline stage is drawn and dropped.
    auto weight = [&](const std::string& name, std::vector<int64_t> sizes, bool held = true) {
      return slice(name, sizes, endsWith(name, "c_proj.weight") ? residualStd : 0.02, held);
    };
    auto zeros = [&](const std::string& name, int64_t n) {
      const TensorCut cut = tensorCut(name);
      return at::zeros({cut.split() ? n / t : n});
    };
    auto transformer = register_module("transformer", std::make_shared<nn::Module>());
    // The token embedding is the head too: the first and the last stage hold it.
    at::Tensor wte = weight("transformer.wte.weight", {v, c}, part.input || part.output);
    if (wte.defined()) {
      wte_ = transformer->register_module("wte", VocabParallelEmbedding(wte, vocabFirst_, group_));
    }
    at::Tensor wpe = weight("transformer.wpe.weight", {o.blockSize, c}, part.input);
    if (wpe.defined()) wpe_ = transformer->register_module("wpe", detail::Holder(wpe));
    auto h = transformer->register_module("h", std::make_shared<nn::Module>());
    for (int64_t i = 0; i < o.nLayer; ++i) {
      const std::string p = fmt::format("transformer.h.{}.", i);
      const bool held = part.holds(i, o.nLayer);
      at::Tensor qkvW = weight(p + "attn.c_attn.weight", {3 * c, c}, held);
      at::Tensor projW = weight(p + "attn.c_proj.weight", {c, c}, held);
      at::Tensor fcW = weight(p + "mlp.c_fc.weight", {4 * c, c}, held);
      at::Tensor mlpW = weight(p + "mlp.c_proj.weight", {c, 4 * c}, held);
      if (!held) continue;
      auto bias = [&](const std::string& name, int64_t n) { return o.bias ? zeros(p + name, n) : at::Tensor(); };
      Attention attn(ColumnParallelLinear(qkvW, bias("attn.c_attn.bias", 3 * c), group_),
                     RowParallelLinear(projW, bias("attn.c_proj.bias", c), group_), o.nHead / t);
      Mlp mlp(ColumnParallelLinear(fcW, bias("mlp.c_fc.bias", 4 * c), group_),
              RowParallelLinear(mlpW, bias("mlp.c_proj.bias", c), group_), o.geluTanh);
      blocks_.push_back(h->register_module(std::to_string(i), Block(Norm(c, o.bias), attn, Norm(c, o.bias), mlp)));
      blockIndex_.push_back(i);
    }
    if (part.output) lnF_ = transformer->register_module("ln_f", Norm(c, o.bias));
  }

  at::Tensor forward(const at::Tensor& tokens) override {
    const int64_t s = checkInput(tokens);
    at::Tensor x;
    if (!part_.input) {
      // A later pipeline stage: the residual stream [B, S, C], whole.
      x = tokens;
    } else if (sequence_) {
      const at::Tensor& wpe = wpe_->weight;
      // This rank's positions [r S/T, (r+1) S/T): their embeddings' sum.
      const int64_t width = s / group_.worldSize;
      x = wte_->forwardScattered(tokens, 1);
      x = x + torch::embedding(wpe, torch::arange(group_.rank * width, (group_.rank + 1) * width,
                                                  tokens.options().dtype(torch::kLong)));
    } else {
      x = wte_(tokens) + torch::embedding(wpe_->weight, torch::arange(s, tokens.options().dtype(torch::kLong)));
    }
    x = runBlocks(x, [this](size_t k, const at::Tensor& in) { return blocks_[k]->forward(in, sequence_); });
    if (!part_.output) return x;
    // The head is this rank's rows of the token embedding (tied).
    return head(lnF_(x), wte_->weight);
  }

  std::vector<std::pair<std::string, std::string>> tiedNames() const override {
    if (!part_.output) return {};
    return {{models::kTiedHeadName, "transformer.wte.weight"}};
  }

  std::vector<std::pair<std::string, TensorCut>> wholeCuts() const override {
    std::vector<std::string> names{"transformer.wte.weight"};
    for (int64_t i = 0; i < layers_; ++i) {
      for (const char* name : {"attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "mlp.c_fc.weight",
                               "mlp.c_fc.bias", "mlp.c_proj.weight"}) {
        const std::string full = fmt::format("transformer.h.{}.{}", i, name);
        if (bias_ || !endsWith(full, ".bias")) names.push_back(full);
      }
    }
    return splitOf(names);
  }

 private:
  int64_t layers_;
  bool bias_;
  VocabParallelEmbedding wte_{nullptr};
  detail::Holder wpe_{nullptr};
  Norm lnF_{nullptr};
  std::vector<Block> blocks_;
};

}  // namespace

void checkGptTensorSplit(const models::GptOptions& o, int tensors) {
  if (tensors < 1) throw ConfigError(fmt::format("tensor parallelism needs at least 1 rank, got {}", tensors));
  for (const auto& [value, what] : {std::pair{o.nHead, std::string("model.n_head")},
                                    std::pair{4 * o.nEmbd, std::string("the MLP's width (4 x model.n_embd)")},
                                    std::pair{o.vocabSize, std::string("model.vocab_size")}}) {
    if (value % tensors != 0) {
      throw ConfigError(fmt::format("distribution.tensor: {} ranks cannot split the model: {} ({}) is not divisible by {}", tensors,
                                    what, value, tensors));
    }
  }
  if (o.dropout != 0) {
    throw ConfigError(fmt::format("model.dropout: {} with tensor parallelism; only 0 is supported so far",
                                  o.dropout));
  }
}

std::shared_ptr<TensorParallelModel> createTensorParallelGpt(const models::GptOptions& o, const comm::Comm& group,
                                                             TensorSplitOptions split,
                                                             c10::optional<at::Generator> generator,
                                                             const models::ModelPart& part) {
  checkGptTensorSplit(o, group.worldSize);
  if (o.nEmbd % o.nHead != 0) {
    throw ConfigError(fmt::format("model.n_embd: {} is not divisible by model.n_head ({})", o.nEmbd, o.nHead));
  }
  torch::NoGradGuard noGrad;
  auto model = std::make_shared<SplitGpt>(o, group, split, generator, part);
  model->startExchanges(split);
  return model;
}

}  // namespace cohort::parallel
