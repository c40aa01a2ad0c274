#include "cohort/models/bert.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/models/fused_ops.h"
#include "cohort/models/linear.h"
#include "models/recompute.h"

namespace cohort::models {
namespace {

namespace nn = torch::nn;

// A linear module's product through models::linear (oneDNN on the CPU).
at::Tensor bertDense(const nn::Linear& l, const at::Tensor& x) { return linear(x, l->weight, l->bias); }

nn::LayerNorm layerNorm(int64_t n, double eps) {
  return nn::LayerNorm(nn::LayerNormOptions({n}).eps(eps).elementwise_affine(true));
}

// Bidirectional multi-head self-attention; `hidden` [B, 1, 1, T] is
// -inf at the keys no position may see (padding), 0 elsewhere, or undefined.
class BertSelfAttentionImpl : public nn::Module {
 public:
  explicit BertSelfAttentionImpl(const BertOptions& o) : heads_(o.nHead) {
    query_ = register_module("query", nn::Linear(o.nEmbd, o.nEmbd));
    key_ = register_module("key", nn::Linear(o.nEmbd, o.nEmbd));
    value_ = register_module("value", nn::Linear(o.nEmbd, o.nEmbd));
    dropout_ = register_module("dropout", nn::Dropout(o.dropout));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& hidden) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads_;
    auto heads = [&](const at::Tensor& m) { return m.view({b, t, heads_, d}).transpose(1, 2); };
    at::Tensor scores = torch::matmul(heads(bertDense(query_, x)), heads(bertDense(key_, x)).transpose(2, 3)) /
                        std::sqrt(static_cast<double>(d));
    if (hidden.defined()) scores = scores + hidden.to(scores.scalar_type());
    const at::Tensor att = dropout_(torch::softmax(scores, -1));
    return torch::matmul(att, heads(bertDense(value_, x))).transpose(1, 2).contiguous().view({b, t, c});
  }

 private:
  int64_t heads_;
  nn::Linear query_{nullptr}, key_{nullptr}, value_{nullptr};
  nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(BertSelfAttention);

// dense, dropout, then LayerNorm of the residual sum: BertSelfOutput and
// BertOutput alike.
class BertResidualImpl : public nn::Module {
 public:
  BertResidualImpl(int64_t in, const BertOptions& o) {
    dense_ = register_module("dense", nn::Linear(in, o.nEmbd));
    LayerNorm_ = register_module("LayerNorm", layerNorm(o.nEmbd, o.normEps));
    dropout_ = register_module("dropout", nn::Dropout(o.dropout));
  }
  at::Tensor forward(const at::Tensor& h, const at::Tensor& residual) {
    return LayerNorm_(dropout_(bertDense(dense_, h)) + residual);
  }

 private:
  nn::Linear dense_{nullptr};
  nn::LayerNorm LayerNorm_{nullptr};
  nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(BertResidual);

class BertAttentionImpl : public nn::Module {
 public:
  explicit BertAttentionImpl(const BertOptions& o) {
    self_ = register_module("self", BertSelfAttention(o));
    output_ = register_module("output", BertResidual(o.nEmbd, o));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& hidden) { return output_(self_(x, hidden), x); }

 private:
  BertSelfAttention self_{nullptr};
  BertResidual output_{nullptr};
};
TORCH_MODULE(BertAttention);

class BertDenseImpl : public nn::Module {  // BertIntermediate: dense then GELU
 public:
  explicit BertDenseImpl(const BertOptions& o) { dense_ = register_module("dense", nn::Linear(o.nEmbd, o.intermediate)); }
  at::Tensor forward(const at::Tensor& x) { return biasGelu(bertDense(dense_, x), at::Tensor(), false); }

 private:
  nn::Linear dense_{nullptr};
};
TORCH_MODULE(BertDense);

class BertLayerImpl : public nn::Module {
 public:
  explicit BertLayerImpl(const BertOptions& o) {
    attention_ = register_module("attention", BertAttention(o));
    intermediate_ = register_module("intermediate", BertDense(o));
    output_ = register_module("output", BertResidual(o.intermediate, o));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& hidden) {
    const at::Tensor a = attention_(x, hidden);
    return output_(intermediate_(a), a);
  }

 private:
  BertAttention attention_{nullptr};
  BertDense intermediate_{nullptr};
  BertResidual output_{nullptr};
};
TORCH_MODULE(BertLayer);

class BertEmbeddingsImpl : public nn::Module {
 public:
  explicit BertEmbeddingsImpl(const BertOptions& o) {
    word_embeddings = register_module("word_embeddings", nn::Embedding(o.vocabSize, o.nEmbd));
    position_embeddings_ = register_module("position_embeddings", nn::Embedding(o.blockSize, o.nEmbd));
    token_type_embeddings_ = register_module("token_type_embeddings", nn::Embedding(o.typeVocab, o.nEmbd));
    LayerNorm_ = register_module("LayerNorm", layerNorm(o.nEmbd, o.normEps));
    dropout_ = register_module("dropout", nn::Dropout(o.dropout));
  }
  at::Tensor forward(const at::Tensor& tokens) {
    const at::Tensor positions = torch::arange(tokens.size(1), tokens.options());
    // Segment 0 everywhere: its row, broadcast.
    const at::Tensor x = word_embeddings(tokens) + position_embeddings_(positions) + token_type_embeddings_->weight[0];
    return dropout_(LayerNorm_(x));
  }
  nn::Embedding word_embeddings{nullptr};

 private:
  nn::Embedding position_embeddings_{nullptr}, token_type_embeddings_{nullptr};
  nn::LayerNorm LayerNorm_{nullptr};
  nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(BertEmbeddings);

// "bert": the embeddings, the encoder's layers and, for classification,
// the pooler.
class BertBodyImpl : public nn::Module {
 public:
  explicit BertBodyImpl(const BertOptions& o) {
    embeddings = register_module("embeddings", BertEmbeddings(o));
    auto encoder = register_module("encoder", std::make_shared<nn::Module>());
    auto layer = encoder->register_module("layer", std::make_shared<nn::Module>());
    for (int64_t i = 0; i < o.nLayer; ++i) layers.push_back(layer->register_module(std::to_string(i), BertLayer(o)));
    if (o.numClasses > 0) {
      auto pooler = register_module("pooler", std::make_shared<nn::Module>());
      pooler_dense = pooler->register_module("dense", nn::Linear(o.nEmbd, o.nEmbd));
    }
  }
  BertEmbeddings embeddings{nullptr};
  std::vector<BertLayer> layers;
  nn::Linear pooler_dense{nullptr};
};
TORCH_MODULE(BertBody);

bool isBias(const std::string& name) {
  const std::string tail = ".bias";
  return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

class Bert : public Model {
 public:
  explicit Bert(const BertOptions& o) : o_(o) {
    bert_ = register_module("bert", BertBody(o));
    if (o.numClasses > 0) {
      dropout_ = register_module("dropout", nn::Dropout(o.dropout));
      classifier_ = register_module("classifier", nn::Linear(o.nEmbd, o.numClasses));
    } else {
      auto cls = register_module("cls", std::make_shared<nn::Module>());
      auto predictions = cls->register_module("predictions", std::make_shared<nn::Module>());
      bias_ = predictions->register_parameter("bias", torch::zeros({o.vocabSize}));
      auto transform = predictions->register_module("transform", std::make_shared<nn::Module>());
      transform_dense_ = transform->register_module("dense", nn::Linear(o.nEmbd, o.nEmbd));
      transform_norm_ = transform->register_module("LayerNorm", layerNorm(o.nEmbd, o.normEps));
    }
    // Hugging Face's initialization, in the parameters' order.
    torch::NoGradGuard noGrad;
    for (auto& p : named_parameters()) {
      const std::string& name = p.key();
      if (name.find("LayerNorm") != std::string::npos) continue;  // ones and zeros already
      if (isBias(name) || name == kBertBiasName) {
        p.value().zero_();
      } else {
        p.value().normal_(0.0, 0.02);
      }
    }
    if (o.padId >= 0 && o.padId < o.vocabSize) bert_->embeddings->word_embeddings->weight[o.padId].zero_();
  }

  // Fine-tuned from a pretrained encoder (a masked-LM file), the pooler and
  // the classifier start as built.
  std::vector<std::string> optionalWeights() const override {
    if (o_.numClasses == 0) return {};
    return {"bert.pooler.", "classifier."};
  }

  std::vector<std::pair<std::string, std::string>> tiedNames() const override {
    if (o_.numClasses > 0) return {};
    return {{kBertDecoderName, kBertEmbeddingName}, {kBertDecoderBiasName, kBertBiasName}};
  }

  at::Tensor forward(const at::Tensor& tokens) override {
    if (tokens.dim() != 2) {
      throw DataError(fmt::format("bert: expected tokens [batch, time], got {} dimension(s)", tokens.dim()));
    }
    if (tokens.size(1) > o_.blockSize) {
      throw DataError(fmt::format("bert: a sequence of {} tokens is longer than model.block_size ({})",
                                  tokens.size(1), o_.blockSize));
    }
    at::Tensor hidden;
    if (o_.padId >= 0) {
      hidden = torch::zeros(tokens.sizes(), torch::TensorOptions().device(tokens.device()))
                   .masked_fill(tokens == o_.padId, -std::numeric_limits<double>::infinity())
                   .view({tokens.size(0), 1, 1, tokens.size(1)});
    }
    at::Tensor x = bert_->embeddings(tokens);
    const bool again = o_.recompute && is_training();
    for (BertLayer layer : bert_->layers) {
      auto f = [layer, hidden](const at::Tensor& y) mutable { return layer->forward(y, hidden); };
      x = again ? recomputed(f, x) : f(x);
    }
    if (o_.numClasses > 0) {
      const at::Tensor pooled = torch::tanh(bertDense(bert_->pooler_dense, x.select(1, 0)));
      return bertDense(classifier_, dropout_(pooled));
    }
    const at::Tensor h = transform_norm_(biasGelu(bertDense(transform_dense_, x), at::Tensor(), false));
    return models::linear(h, bert_->embeddings->word_embeddings->weight, bias_);
  }

 private:
  BertOptions o_;
  BertBody bert_{nullptr};
  nn::Dropout dropout_{nullptr};
  nn::Linear classifier_{nullptr}, transform_dense_{nullptr};
  nn::LayerNorm transform_norm_{nullptr};
  at::Tensor bias_;
};

}  // namespace

BertOptions bertOptions(const ModelConfig& config, int64_t vocabSize, int64_t padId) {
  BertOptions o;
  o.vocabSize = config.vocabSize > 0 ? config.vocabSize : vocabSize;
  o.blockSize = config.blockSize;
  o.nLayer = config.nLayer;
  o.nHead = config.nHead;
  o.nEmbd = config.nEmbd;
  o.intermediate = intermediateWidth(config);
  o.normEps = config.normEps > 0 ? config.normEps : 1e-12;
  o.dropout = config.dropout;
  o.numClasses = config.task == BertTask::classify ? config.numClasses : 0;
  o.padId = padId;
  o.recompute = config.recompute == Recompute::blocks;
  return o;
}

std::shared_ptr<Model> createBert(const BertOptions& o) {
  for (const auto& [value, key] :
       {std::pair{o.vocabSize, "model.vocab_size"}, std::pair{o.blockSize, "model.block_size"},
        std::pair{o.nLayer, "model.n_layer"}, std::pair{o.nHead, "model.n_head"}, std::pair{o.nEmbd, "model.n_embd"},
        std::pair{o.intermediate, "model.intermediate_size"}}) {
    if (value < 1) throw ConfigError(fmt::format("{}: must be >= 1, got {}", key, value));
  }
  if (o.nEmbd % o.nHead != 0) {
    throw ConfigError(fmt::format("model.n_embd: {} is not divisible by model.n_head ({})", o.nEmbd, o.nHead));
  }
  if (!(o.dropout >= 0 && o.dropout < 1)) {
    throw ConfigError(fmt::format("model.dropout: must be in [0, 1), got {}", o.dropout));
  }
  return std::make_shared<Bert>(o);
}

}  // namespace cohort::models
