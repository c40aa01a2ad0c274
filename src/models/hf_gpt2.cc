#include "cohort/models/hf_gpt2.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>

#include "cohort/ckpt/weights.h"
#include "cohort/core/error.h"
#include "models/hf_json.h"

namespace cohort::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::regex& maskBuffer() {
  static const std::regex r(R"((^|\.)h\.\d+\.attn\.(masked_)?bias$)");
  return r;
}

// cohort's name of Hugging Face's `name`: GPT2Model's names get the prefix.
std::string cohortName(const std::string& name) {
  if (name.rfind("transformer.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return name;
  return "transformer." + name;
}

class HfGpt2Source final : public ckpt::TensorSource {
 public:
  HfGpt2Source(std::unique_ptr<ckpt::TensorSource> hf, std::string origin)
      : hf_(std::move(hf)), origin_(std::move(origin)) {
    for (const auto& [name, t] : hf_->entries()) {
      if (std::regex_search(name, maskBuffer())) continue;
      const std::string own = cohortName(name);
      const bool transposed = hfTransposed(own);
      if (transposed && t.dim() != 2) {
        throw DataError(fmt::format("{}: tensor '{}' has shape [{}]: a Conv1D weight has 2 dimensions", origin_,
                                    name, fmt::join(t.sizes(), ", ")));
      }
      if (from_.count(own) != 0) {
        throw DataError(fmt::format("{}: tensors '{}' and '{}' are both cohort's '{}'", origin_, from_[own].name,
                                    name, own));
      }
      from_[own] = {name, transposed};
      entries_.emplace_back(own, transposed ? ckpt::withoutData({t.size(1), t.size(0)}, t.scalar_type()) : t);
    }
  }

  const ckpt::StateDict& entries() const override { return entries_; }

  at::Tensor load(const std::string& name) override {
    auto it = from_.find(name);
    if (it == from_.end()) throw DataError(fmt::format("{}: no tensor '{}'", origin_, name));
    at::Tensor t = hf_->load(it->second.name);
    if (!it->second.transposed) return t;
    at::Tensor own = t.t().contiguous();
    hf_->drop(it->second.name);
    return own;
  }

  void drop(const std::string& name) override {
    auto it = from_.find(name);
    if (it != from_.end() && !it->second.transposed) hf_->drop(it->second.name);
  }

 private:
  struct From {
    std::string name;
    bool transposed = false;
  };
  std::unique_ptr<ckpt::TensorSource> hf_;
  std::string origin_;
  ckpt::StateDict entries_;
  std::map<std::string, From> from_;
};

const char* hfActivation(Activation a) { return a == Activation::geluTanh ? "gelu_new" : "gelu"; }

}  // namespace

bool hfTransposed(const std::string& name) {
  static const std::regex r(R"(^transformer\.h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$)");
  return std::regex_match(name, r);
}

bool isHfGpt2(const ckpt::StateDict& entries) {
  for (const auto& [name, t] : entries) {
    if (std::regex_search(name, maskBuffer())) return true;
    if (name.rfind("h.", 0) == 0 || name == "wte.weight" || name == "wpe.weight") return true;
    static const std::regex cAttn(R"((^|\.)h\.\d+\.attn\.c_attn\.weight$)");
    // cohort's Linear is [3 n_embd, n_embd]; Hugging Face's Conv1D [n_embd, 3 n_embd].
    if (t.dim() == 2 && std::regex_search(name, cAttn) && t.size(1) == 3 * t.size(0)) return true;
  }
  return false;
}

std::unique_ptr<ckpt::TensorSource> hfGpt2AsCohort(std::unique_ptr<ckpt::TensorSource> hf, std::string origin) {
  return std::make_unique<HfGpt2Source>(std::move(hf), std::move(origin));
}

json hfGpt2Config(const GptOptions& o, Activation activation) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", o.vocabSize},
          {"n_positions", o.blockSize},
          {"n_ctx", o.blockSize},
          {"n_embd", o.nEmbd},
          {"n_layer", o.nLayer},
          {"n_head", o.nHead},
          {"n_inner", nullptr},
          {"activation_function", hfActivation(activation)},
          {"resid_pdrop", o.dropout},
          {"embd_pdrop", o.dropout},
          {"attn_pdrop", o.dropout},
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", true},
          {"use_cache", true},
          {"torch_dtype", "float32"}};
}

void checkHfGpt2Config(const json& config, const GptOptions& o, Activation activation, const std::string& origin) {
  const std::string type = stringAt(config, "model_type", "(none)", origin);
  if (type != "gpt2") {
    throw DataError(fmt::format("{}: model_type '{}': cohort reads Hugging Face GPT-2 checkpoints (model_type gpt2) "
                                "into model.arch gpt, no other architecture",
                                origin, type));
  }
  struct Size {
    const char* key;
    int64_t want;
    const char* job;
  };
  for (const Size& s : {Size{"n_layer", o.nLayer, "model.n_layer"}, Size{"n_head", o.nHead, "model.n_head"},
                        Size{"n_embd", o.nEmbd, "model.n_embd"}, Size{"n_positions", o.blockSize, "model.block_size"},
                        Size{"vocab_size", o.vocabSize, "model.vocab_size"}}) {
    if (s.want <= 0) continue;  // vocab_size taken from the data, not known here
    const auto it = config.find(s.key);
    if (it == config.end() || !it->is_number_integer()) {
      throw DataError(fmt::format("{}: no integer {}", origin, s.key));
    }
    if (it->get<int64_t>() != s.want) {
      throw DataError(fmt::format("{}: {} is {}, the job's {} is {}: set {}: {}", origin, s.key, it->get<int64_t>(),
                                  s.job, s.want, s.job, it->get<int64_t>()));
    }
  }
  if (auto it = config.find("n_inner"); it != config.end() && !it->is_null() &&
                                        !(it->is_number_integer() && it->get<int64_t>() == 4 * o.nEmbd)) {
    throw DataError(fmt::format("{}: n_inner is {}; cohort's gpt has an MLP of 4 n_embd ({})", origin, it->dump(),
                                4 * o.nEmbd));
  }
  const std::string act = stringAt(config, "activation_function", "gelu_new", origin);
  std::optional<Activation> theirs;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") theirs = Activation::geluTanh;
  if (act == "gelu") theirs = Activation::gelu;
  if (!theirs) {
    throw DataError(fmt::format("{}: activation_function '{}': cohort's gpt has gelu (exact) or gelu_new (the tanh "
                                "approximation)",
                                origin, act));
  }
  if (*theirs != activation) {
    throw DataError(fmt::format("{}: activation_function {} is model.activation {}; the job has {}: set "
                                "model.activation: {}",
                                origin, act, choiceName(*theirs), choiceName(activation), choiceName(*theirs)));
  }
  if (auto it = config.find("layer_norm_epsilon");
      it != config.end() && !(it->is_number() && std::abs(it->get<double>() - 1e-5) < 1e-12)) {
    throw DataError(fmt::format("{}: layer_norm_epsilon {}; cohort's LayerNorm has 1e-05", origin, it->dump()));
  }
}

}  // namespace cohort::models
