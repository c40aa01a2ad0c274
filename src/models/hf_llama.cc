#include "cohort/models/hf_llama.h"

#include <fmt/format.h>

#include <cmath>
#include <regex>
#include <vector>

#include "cohort/core/error.h"
#include "models/hf_json.h"

namespace cohort::models {
namespace {

using nlohmann::json;

bool same(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); }

}  // namespace

json hfLlamaConfig(const LlamaOptions& o) {
  json scaling = nullptr;
  if (o.rope.scaling == RopeScaling::linear) scaling = {{"rope_type", "linear"}, {"factor", o.rope.factor}};
  if (o.rope.scaling == RopeScaling::llama3) {
    scaling = {{"rope_type", "llama3"},
               {"factor", o.rope.factor},
               {"low_freq_factor", o.rope.lowFreqFactor},
               {"high_freq_factor", o.rope.highFreqFactor},
               {"original_max_position_embeddings", o.rope.originalContext}};
  }
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", o.vocabSize},
          {"hidden_size", o.nEmbd},
          {"intermediate_size", o.intermediate},
          {"num_hidden_layers", o.nLayer},
          {"num_attention_heads", o.nHead},
          {"num_key_value_heads", o.nKvHead},
          {"head_dim", o.nEmbd / o.nHead},
          {"max_position_embeddings", o.blockSize},
          {"rms_norm_eps", o.normEps},
          {"rope_theta", o.rope.theta},
          {"rope_scaling", scaling},
          {"tie_word_embeddings", o.tiedHead},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"attention_dropout", 0.0},
          {"initializer_range", 0.02},
          {"pretraining_tp", 1},
          {"use_cache", true},
          {"torch_dtype", "float32"}};
}

LlamaOptions llamaOptionsOf(const json& c, const std::string& origin) {
  const std::string type = stringAt(c, "model_type", "(none)", origin);
  if (type != "llama") {
    throw DataError(fmt::format("{}: model_type '{}': model.arch llama reads Hugging Face Llama checkpoints "
                                "(model_type llama)",
                                origin, type));
  }
  LlamaOptions o;
  o.vocabSize = integerAt(c, "vocab_size", -1, origin);
  o.nEmbd = integerAt(c, "hidden_size", -1, origin);
  o.intermediate = integerAt(c, "intermediate_size", -1, origin);
  o.nLayer = integerAt(c, "num_hidden_layers", -1, origin);
  o.nHead = integerAt(c, "num_attention_heads", -1, origin);
  o.nKvHead = integerAt(c, "num_key_value_heads", o.nHead, origin);
  o.blockSize = integerAt(c, "max_position_embeddings", 2048, origin);
  o.normEps = numberAt(c, "rms_norm_eps", 1e-6, origin);
  o.rope.theta = numberAt(c, "rope_theta", 10000, origin);
  if (auto it = c.find("tie_word_embeddings"); it != c.end() && !it->is_null()) {
    if (!it->is_boolean()) throw DataError(fmt::format("{}: tie_word_embeddings is {}, not true or false", origin, it->dump()));
    o.tiedHead = it->get<bool>();
  }
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"hidden_size", o.nEmbd},
                                   {"intermediate_size", o.intermediate},
                                   {"num_hidden_layers", o.nLayer},
                                   {"num_attention_heads", o.nHead},
                                   {"num_key_value_heads", o.nKvHead},
                                   {"vocab_size", o.vocabSize}}) {
    if (value < 1) throw DataError(fmt::format("{}: {} is {}; it must be >= 1", origin, key, value));
  }
  if (o.nEmbd % o.nHead != 0 || o.nHead % o.nKvHead != 0) {
    throw DataError(fmt::format("{}: hidden_size {}, num_attention_heads {}, num_key_value_heads {}: the heads "
                                "must divide the width and the key/value heads the heads",
                                origin, o.nEmbd, o.nHead, o.nKvHead));
  }
  if (const int64_t d = integerAt(c, "head_dim", o.nEmbd / o.nHead, origin); d != o.nEmbd / o.nHead) {
    throw DataError(fmt::format("{}: head_dim {} is not hidden_size / num_attention_heads ({}); cohort's llama "
                                "has heads of that width",
                                origin, d, o.nEmbd / o.nHead));
  }
  if (const std::string act = stringAt(c, "hidden_act", "silu", origin); act != "silu") {
    throw DataError(fmt::format("{}: hidden_act '{}': cohort's llama has a SwiGLU MLP (silu)", origin, act));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (auto it = c.find(key); it != c.end() && !(it->is_boolean() && !it->get<bool>()) && !it->is_null()) {
      throw DataError(fmt::format("{}: {} is {}: cohort's llama has no biases", origin, key, it->dump()));
    }
  }
  if (auto it = c.find("rope_scaling"); it != c.end() && !it->is_null()) {
    if (!it->is_object()) throw DataError(fmt::format("{}: rope_scaling is {}, not an object", origin, it->dump()));
    std::string kind = stringAt(*it, "rope_type", "", origin + ": rope_scaling");
    if (kind.empty()) kind = stringAt(*it, "type", "(none)", origin + ": rope_scaling");
    o.rope.factor = numberAt(*it, "factor", 1, origin + ": rope_scaling");
    if (kind == "linear") {
      o.rope.scaling = RopeScaling::linear;
    } else if (kind == "llama3") {
      o.rope.scaling = RopeScaling::llama3;
      o.rope.lowFreqFactor = numberAt(*it, "low_freq_factor", 1, origin + ": rope_scaling");
      o.rope.highFreqFactor = numberAt(*it, "high_freq_factor", 4, origin + ": rope_scaling");
      o.rope.originalContext = integerAt(*it, "original_max_position_embeddings", 8192, origin + ": rope_scaling");
    } else if (kind != "default") {
      throw DataError(fmt::format("{}: rope_scaling's rope_type '{}': cohort's llama has linear and llama3", origin,
                                  kind));
    }
  }
  return o;
}

void checkHfLlamaConfig(const LlamaOptions& theirs, const LlamaOptions& ours, const std::string& origin) {
  checkSizes({{"num_hidden_layers", theirs.nLayer, ours.nLayer, "model.n_layer"},
              {"num_attention_heads", theirs.nHead, ours.nHead, "model.n_head"},
              {"num_key_value_heads", theirs.nKvHead, ours.nKvHead, "model.n_kv_head"},
              {"hidden_size", theirs.nEmbd, ours.nEmbd, "model.n_embd"},
              {"intermediate_size", theirs.intermediate, ours.intermediate, "model.intermediate_size"},
              {"vocab_size", theirs.vocabSize, ours.vocabSize, "model.vocab_size"}},
             origin);
  if (theirs.tiedHead != ours.tiedHead) {
    const char* flag = theirs.tiedHead ? "true" : "false";
    throw DataError(fmt::format("{}: tie_word_embeddings is {}, the job's model.tie_embeddings is {}: set "
                                "model.tie_embeddings: {}",
                                origin, flag, ours.tiedHead ? "true" : "false", flag));
  }
  struct Number {
    const char* key;
    double theirs, ours;
    const char* job;
  };
  for (const Number& n : {Number{"rms_norm_eps", theirs.normEps, ours.normEps, "model.norm_eps"},
                          Number{"rope_theta", theirs.rope.theta, ours.rope.theta, "model.rope.theta"},
                          Number{"rope_scaling.factor", theirs.rope.factor, ours.rope.factor, "model.rope.factor"}}) {
    if (!same(n.theirs, n.ours)) {
      throw DataError(fmt::format("{}: {} is {}, the job's {} is {}: set {}: {}", origin, n.key, n.theirs, n.job,
                                  n.ours, n.job, n.theirs));
    }
  }
  if (theirs.rope.scaling != ours.rope.scaling) {
    throw DataError(fmt::format("{}: rope_scaling is {}, the job's model.rope.scaling is {}: set "
                                "model.rope.scaling: {}",
                                origin, choiceName(theirs.rope.scaling), choiceName(ours.rope.scaling),
                                choiceName(theirs.rope.scaling)));
  }
  if (theirs.rope.scaling == RopeScaling::llama3 &&
      (!same(theirs.rope.lowFreqFactor, ours.rope.lowFreqFactor) ||
       !same(theirs.rope.highFreqFactor, ours.rope.highFreqFactor) ||
       theirs.rope.originalContext != ours.rope.originalContext)) {
    throw DataError(fmt::format("{}: rope_scaling's low_freq_factor {}, high_freq_factor {}, "
                                "original_max_position_embeddings {} differ from the job's model.rope ({}, {}, {})",
                                origin, theirs.rope.lowFreqFactor, theirs.rope.highFreqFactor,
                                theirs.rope.originalContext, ours.rope.lowFreqFactor, ours.rope.highFreqFactor,
                                ours.rope.originalContext));
  }
}

void checkHfLlamaShapes(const LlamaOptions& o, const ckpt::StateDict& entries, const std::string& origin,
                        const std::string& weights) {
  static const std::regex layer(R"(^model\.layers\.(\d+)\.(.+)$)");
  const int64_t d = o.nEmbd / o.nHead;
  for (const auto& [name, t] : entries) {
    std::vector<int64_t> want;
    std::string why;
    std::smatch m;
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      want = {o.vocabSize, o.nEmbd};
      why = "vocab_size and hidden_size";
    } else if (name == "model.norm.weight") {
      want = {o.nEmbd};
      why = "hidden_size";
    } else if (std::regex_match(name, m, layer)) {
      if (std::stoll(m[1].str()) >= o.nLayer) {
        throw DataError(fmt::format("{}: num_hidden_layers is {}, but {} holds '{}'", origin, o.nLayer, weights, name));
      }
      const std::string part = m[2].str();
      if (part == "self_attn.q_proj.weight") {
        want = {o.nHead * d, o.nEmbd};
        why = "num_attention_heads";
      } else if (part == "self_attn.k_proj.weight" || part == "self_attn.v_proj.weight") {
        want = {o.nKvHead * d, o.nEmbd};
        why = "num_key_value_heads";
      } else if (part == "self_attn.o_proj.weight") {
        want = {o.nEmbd, o.nHead * d};
        why = "num_attention_heads";
      } else if (part == "mlp.gate_proj.weight" || part == "mlp.up_proj.weight") {
        want = {o.intermediate, o.nEmbd};
        why = "intermediate_size";
      } else if (part == "mlp.down_proj.weight") {
        want = {o.nEmbd, o.intermediate};
        why = "intermediate_size";
      } else if (part == "input_layernorm.weight" || part == "post_attention_layernorm.weight") {
        want = {o.nEmbd};
        why = "hidden_size";
      }
    }
    if (!want.empty() && t.sizes().vec() != want) {
      throw DataError(fmt::format("{}: {} give '{}' the shape [{}]; {} holds [{}]", origin, why, name,
                                  fmt::join(want, ", "), weights, fmt::join(t.sizes(), ", ")));
    }
  }
}

}  // namespace cohort::models
