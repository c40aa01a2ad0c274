#include "cohort/models/hf_bert.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "cohort/core/error.h"
#include "models/hf_json.h"

namespace cohort::models {
namespace {

using nlohmann::json;

bool hasHead(const std::string& s, const std::string& head) { return s.rfind(head, 0) == 0; }

bool hasTail(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// cohort's name of Hugging Face's `name` for a model of `o`; "" when the
// model has no such tensor.
std::string cohortName(std::string name, const BertOptions& o) {
  if (hasTail(name, "position_ids") || hasHead(name, "cls.seq_relationship.")) return "";
  if (!hasHead(name, "bert.") && !hasHead(name, "cls.") && !hasHead(name, "classifier.")) {
    name = "bert." + name;  // BertModel's names
  }
  for (const auto& [old, now] : {std::pair<std::string, std::string>{".gamma", ".weight"}, {".beta", ".bias"}}) {
    if (hasTail(name, old) && name.find("LayerNorm") != std::string::npos) {
      name = name.substr(0, name.size() - old.size()) + now;
    }
  }
  const bool classify = o.numClasses > 0;
  if (classify && hasHead(name, "cls.")) return "";
  if (!classify && (hasHead(name, "bert.pooler.") || hasHead(name, "classifier."))) return "";
  return name;
}

class HfBertSource final : public ckpt::TensorSource {
 public:
  HfBertSource(std::unique_ptr<ckpt::TensorSource> hf, const BertOptions& o, std::string origin)
      : hf_(std::move(hf)), origin_(std::move(origin)) {
    for (const auto& [name, t] : hf_->entries()) {
      const std::string own = cohortName(name, o);
      if (own.empty()) continue;
      if (from_.count(own) != 0) {
        throw DataError(fmt::format("{}: tensors '{}' and '{}' are both cohort's '{}'", origin_, from_[own], name, own));
      }
      from_[own] = name;
      entries_.emplace_back(own, t);
    }
  }
  const ckpt::StateDict& entries() const override { return entries_; }
  at::Tensor load(const std::string& name) override {
    auto it = from_.find(name);
    if (it == from_.end()) throw DataError(fmt::format("{}: no tensor '{}'", origin_, name));
    return hf_->load(it->second);
  }
  void drop(const std::string& name) override {
    if (auto it = from_.find(name); it != from_.end()) hf_->drop(it->second);
  }

 private:
  std::unique_ptr<ckpt::TensorSource> hf_;
  std::string origin_;
  ckpt::StateDict entries_;
  std::map<std::string, std::string> from_;
};

}  // namespace

json hfBertConfig(const BertOptions& o) {
  json c = {{"model_type", "bert"},
            {"vocab_size", o.vocabSize},
            {"hidden_size", o.nEmbd},
            {"num_hidden_layers", o.nLayer},
            {"num_attention_heads", o.nHead},
            {"intermediate_size", o.intermediate},
            {"hidden_act", "gelu"},
            {"hidden_dropout_prob", o.dropout},
            {"attention_probs_dropout_prob", o.dropout},
            {"max_position_embeddings", o.blockSize},
            {"type_vocab_size", o.typeVocab},
            {"layer_norm_eps", o.normEps},
            {"initializer_range", 0.02},
            {"position_embedding_type", "absolute"},
            {"pad_token_id", o.padId >= 0 ? o.padId : 0},
            {"torch_dtype", "float32"}};
  if (o.numClasses > 0) {
    c["architectures"] = {"BertForSequenceClassification"};
    json id2label = json::object(), label2id = json::object();
    for (int64_t k = 0; k < o.numClasses; ++k) {
      id2label[std::to_string(k)] = fmt::format("LABEL_{}", k);
      label2id[fmt::format("LABEL_{}", k)] = k;
    }
    c["id2label"] = id2label;
    c["label2id"] = label2id;
    c["problem_type"] = "single_label_classification";
  } else {
    c["architectures"] = {"BertForMaskedLM"};
  }
  return c;
}

BertOptions bertOptionsOf(const json& c, const std::string& origin) {
  const std::string type = stringAt(c, "model_type", "(none)", origin);
  if (type != "bert") {
    throw DataError(fmt::format("{}: model_type '{}': model.arch bert reads Hugging Face BERT checkpoints "
                                "(model_type bert)",
                                origin, type));
  }
  BertOptions o;
  o.vocabSize = integerAt(c, "vocab_size", -1, origin);
  o.nEmbd = integerAt(c, "hidden_size", -1, origin);
  o.nLayer = integerAt(c, "num_hidden_layers", -1, origin);
  o.nHead = integerAt(c, "num_attention_heads", -1, origin);
  o.intermediate = integerAt(c, "intermediate_size", -1, origin);
  o.blockSize = integerAt(c, "max_position_embeddings", 512, origin);
  o.typeVocab = integerAt(c, "type_vocab_size", 2, origin);
  o.normEps = numberAt(c, "layer_norm_eps", 1e-12, origin);
  if (const std::string act = stringAt(c, "hidden_act", "gelu", origin); act != "gelu") {
    throw DataError(fmt::format("{}: hidden_act '{}': cohort's bert has gelu", origin, act));
  }
  if (const std::string pos = stringAt(c, "position_embedding_type", "absolute", origin); pos != "absolute") {
    throw DataError(fmt::format("{}: position_embedding_type '{}': cohort's bert has absolute positions", origin, pos));
  }
  return o;
}

void checkHfBertConfig(const BertOptions& theirs, const BertOptions& ours, const std::string& origin) {
  checkSizes({{"num_hidden_layers", theirs.nLayer, ours.nLayer, "model.n_layer"},
              {"num_attention_heads", theirs.nHead, ours.nHead, "model.n_head"},
              {"hidden_size", theirs.nEmbd, ours.nEmbd, "model.n_embd"},
              {"intermediate_size", theirs.intermediate, ours.intermediate, "model.intermediate_size"},
              {"max_position_embeddings", theirs.blockSize, ours.blockSize, "model.block_size"},
              {"vocab_size", theirs.vocabSize, ours.vocabSize, "model.vocab_size"}},
             origin);
  if (std::abs(theirs.normEps - ours.normEps) > 1e-9 * std::max(theirs.normEps, ours.normEps)) {
    throw DataError(fmt::format("{}: layer_norm_eps is {}, the job's model.norm_eps is {}: set model.norm_eps: {}",
                                origin, theirs.normEps, ours.normEps, theirs.normEps));
  }
  if (theirs.typeVocab != ours.typeVocab) {
    throw DataError(fmt::format("{}: type_vocab_size is {}; cohort's bert has {} segments", origin, theirs.typeVocab,
                                ours.typeVocab));
  }
}

std::unique_ptr<ckpt::TensorSource> hfBertAsCohort(std::unique_ptr<ckpt::TensorSource> hf, const BertOptions& o,
                                                   std::string origin) {
  return std::make_unique<HfBertSource>(std::move(hf), o, std::move(origin));
}

}  // namespace cohort::models
