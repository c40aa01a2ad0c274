// The Llama-family decoder (models/llama.h): Hugging Face's names and
// shapes, its forward against an independent one written here from the
// published equations (rotary embedding by complex multiplication, grouped
// heads by repetition), causality, the rotary scalings, recomputation,
// bf16, LoRA's targets, and the sizes it refuses.

#include "cohort/models/llama.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/models/lora.h"
#include "cohort/models/model.h"
#include "util/errors.h"
#include "util/runs.h"

namespace cohort::models {
namespace {

ModelConfig llamaConfig(int64_t kvHeads = 2, bool tied = false) {
  ModelConfig c;
  c.arch = ModelArch::llama;
  c.vocabSize = 40;
  c.blockSize = 16;
  c.nLayer = 2;
  c.nHead = 4;
  c.nKvHead = kvHeads;
  c.nEmbd = 32;
  c.intermediateSize = 48;
  c.tieEmbeddings = tied;
  c.rope.theta = 500;  // a small base turns the low dimensions visibly over 16 positions
  return c;
}

// The forward from the equations, in double: x_{l+1} = h + mlp(rms(h)),
// h = x_l + attn(rms(x_l)); rotary: dimensions i and i + D/2 of a head are
// the real and imaginary parts of a complex number turned by pos * f_i.
at::Tensor reference(const std::map<std::string, at::Tensor>& w, const ModelConfig& c, const at::Tensor& tokens) {
  auto W = [&](const std::string& n) { return w.at(n).to(torch::kDouble); };
  auto rms = [&](const at::Tensor& x, const at::Tensor& g) {
    return x / torch::sqrt(x.pow(2).mean(-1, true) + llamaOptions(c, 0).normEps) * g;
  };
  const int64_t t = tokens.size(1), h = c.nHead, kv = c.nKvHead, d = c.nEmbd / c.nHead;
  at::Tensor x = torch::embedding(W("model.embed_tokens.weight"), tokens);
  const at::Tensor f = ropeInverseFrequencies(d, c.rope).to(torch::kDouble);
  const at::Tensor turn = torch::polar(torch::ones({t, d / 2}, torch::kDouble),
                                       torch::outer(torch::arange(t, torch::kDouble), f));  // [T, D/2]
  auto rope = [&](const at::Tensor& m) {  // [B, T, n, D]
    const at::Tensor z = torch::complex(m.narrow(-1, 0, d / 2), m.narrow(-1, d / 2, d / 2)) *
                         turn.view({1, t, 1, d / 2});
    return torch::cat({torch::real(z), torch::imag(z)}, -1);
  };
  const at::Tensor causal = torch::ones({t, t}, torch::kBool).tril();
  for (int64_t l = 0; l < c.nLayer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const at::Tensor a = rms(x, W(p + "input_layernorm.weight"));
    const int64_t b = x.size(0);
    at::Tensor q = rope(torch::matmul(a, W(p + "self_attn.q_proj.weight").t()).view({b, t, h, d}));
    at::Tensor k = rope(torch::matmul(a, W(p + "self_attn.k_proj.weight").t()).view({b, t, kv, d}));
    at::Tensor v = torch::matmul(a, W(p + "self_attn.v_proj.weight").t()).view({b, t, kv, d});
    k = k.repeat_interleave(h / kv, 2);
    v = v.repeat_interleave(h / kv, 2);
    at::Tensor s = torch::einsum("bqhd,bkhd->bhqk", {q, k}) / std::sqrt(static_cast<double>(d));
    s = s.masked_fill(causal.logical_not(), -INFINITY).softmax(-1);
    const at::Tensor y = torch::einsum("bhqk,bkhd->bqhd", {s, v}).reshape({b, t, h * d});
    x = x + torch::matmul(y, W(p + "self_attn.o_proj.weight").t());
    const at::Tensor m = rms(x, W(p + "post_attention_layernorm.weight"));
    const at::Tensor gate = torch::matmul(m, W(p + "mlp.gate_proj.weight").t());
    const at::Tensor up = torch::matmul(m, W(p + "mlp.up_proj.weight").t());
    x = x + torch::matmul(gate * torch::sigmoid(gate) * up, W(p + "mlp.down_proj.weight").t());
  }
  x = rms(x, W("model.norm.weight"));
  const std::string head = c.tieEmbeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  return torch::matmul(x, W(head).t());
}

TEST(Llama, ParameterNamesAndCountAreHuggingFaces) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const ModelConfig c = llamaConfig(2, tied);
    auto m = createModel(c, {});
    const auto w = test::tensorsByName(*m);
    const int64_t C = 32, D = 8, H = 4, KV = 2, I = 48, V = 40;
    const int64_t layer = C * H * D + 2 * C * KV * D + H * D * C + 3 * C * I + 2 * C;
    EXPECT_EQ(parameterCount(*m), V * C + 2 * layer + C + (tied ? 0 : V * C));
    EXPECT_EQ(w.at("model.layers.1.self_attn.k_proj.weight").sizes(), (std::vector<int64_t>{KV * D, C}));
    EXPECT_EQ(w.at("model.layers.0.mlp.gate_proj.weight").sizes(), (std::vector<int64_t>{I, C}));
    EXPECT_EQ(w.at("model.layers.0.mlp.down_proj.weight").sizes(), (std::vector<int64_t>{C, I}));
    EXPECT_EQ(w.count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(w.count("model.layers.0.self_attn.q_proj.bias"), 0u) << "no biases";
    // The published state dict names a tied head twice, as transformers does.
    EXPECT_EQ(publishedStateDict(*m).size(), w.size() + (tied ? 1 : 0));
    EXPECT_EQ(m->shardingUnits(), (std::vector<std::string>{"model.layers.0", "model.layers.1"}));
    EXPECT_EQ(tiedAcrossStages(c).size(), tied ? 1u : 0u);
  }
  // The default MLP width: 8/3 n_embd rounded up to a multiple of 64.
  ModelConfig c = llamaConfig();
  c.intermediateSize = 0;
  c.nEmbd = 96;
  EXPECT_EQ(llamaOptions(c, 0).intermediate, 256);
}

TEST(Llama, ForwardIsTheEquationsWithGroupedHeads) {
  for (int64_t kv : {4, 2, 1}) {
    for (bool tied : {false, true}) {
      SCOPED_TRACE("n_kv_head " + std::to_string(kv) + (tied ? " tied" : ""));
      const ModelConfig c = llamaConfig(kv, tied);
      torch::manual_seed(3);
      auto m = createModel(c, {});
      m->eval();
      // Norm weights away from one, so that a norm applied to the wrong
      // tensor shows.
      {
        torch::NoGradGuard g;
        for (auto& p : m->named_parameters()) {
          if (p.key().find("norm") != std::string::npos) p.value().uniform_(0.5, 1.5);
        }
      }
      const at::Tensor tokens = torch::randint(0, 40, {3, 16}, torch::kLong);
      torch::NoGradGuard g;
      const at::Tensor got = m->forward(tokens);
      const at::Tensor want = reference(test::tensorsByName(*m), c, tokens);
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_LT((got.to(torch::kDouble) - want).abs().max().item<double>(), 2e-5);
    }
  }
}

TEST(Llama, APositionSeesOnlyThePast) {
  torch::manual_seed(4);
  auto m = createModel(llamaConfig(), {});
  m->eval();
  torch::NoGradGuard g;
  at::Tensor a = torch::randint(0, 40, {1, 12}, torch::kLong);
  at::Tensor b = a.clone();
  b[0][7] = (a[0][7].item<int64_t>() + 1) % 40;
  const at::Tensor ya = m->forward(a), yb = m->forward(b);
  EXPECT_TRUE(torch::equal(ya.narrow(1, 0, 7), yb.narrow(1, 0, 7)));
  EXPECT_FALSE(torch::allclose(ya.narrow(1, 7, 1), yb.narrow(1, 7, 1)));
}

TEST(Llama, RotaryScalingsStretchTheLowFrequencies) {
  RopeConfig r;
  r.theta = 10000;
  const at::Tensor plain = ropeInverseFrequencies(64, r).to(torch::kDouble);
  EXPECT_NEAR(plain[1].item<double>(), std::pow(10000.0, -2.0 / 64), 1e-7);
  r.scaling = RopeScaling::linear;
  r.factor = 4;
  EXPECT_TRUE(torch::allclose(ropeInverseFrequencies(64, r).to(torch::kDouble), plain / 4, 1e-6, 0));
  // llama3: wavelengths above context / low_freq_factor divided by the
  // factor, below context / high_freq_factor kept, those between blended.
  r.scaling = RopeScaling::llama3;
  r.factor = 8;
  r.lowFreqFactor = 1;
  r.highFreqFactor = 4;
  r.originalContext = 64;
  const at::Tensor scaled = ropeInverseFrequencies(64, r).to(torch::kDouble);
  int kept = 0, divided = 0, blended = 0;
  for (int64_t i = 0; i < 32; ++i) {
    const double f = plain[i].item<double>(), g = scaled[i].item<double>(), wave = 2 * M_PI / f;
    if (wave < 64.0 / 4) {
      EXPECT_NEAR(g, f, 1e-7 * f) << i;
      ++kept;
    } else if (wave > 64.0) {
      EXPECT_NEAR(g, f / 8, 1e-6 * f) << i;
      ++divided;
    } else {
      const double s = (64.0 / wave - 1) / (4 - 1);
      EXPECT_NEAR(g, (1 - s) * f / 8 + s * f, 1e-6 * f) << i;
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(Llama, RecomputedBlocksGiveTheSameGradients) {
  std::map<std::string, at::Tensor> grads[2];
  for (bool again : {false, true}) {
    ModelConfig c = llamaConfig();
    c.recompute = again ? Recompute::blocks : Recompute::none;
    torch::manual_seed(8);
    auto m = createModel(c, {});
    torch::manual_seed(9);
    const at::Tensor tokens = torch::randint(0, 40, {2, 16}, torch::kLong);
    m->forward(tokens).logsumexp(-1).sum().backward();
    for (auto& p : m->named_parameters()) grads[again].emplace(p.key(), p.value().grad().clone());
  }
  EXPECT_GT(recomputations(), 0);
  for (const auto& [name, g] : grads[0]) EXPECT_TRUE(torch::allclose(g, grads[1].at(name), 1e-5, 1e-6)) << name;
}

TEST(Llama, RunsInBf16NearFloat32) {
  torch::manual_seed(12);
  auto m = createModel(llamaConfig(), {});
  m->eval();
  torch::NoGradGuard g;
  const at::Tensor tokens = torch::randint(0, 40, {2, 16}, torch::kLong);
  const at::Tensor exact = m->forward(tokens);
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(torch::kBFloat16);
  const at::Tensor low = m->forward(tokens);
  at::autocast::set_cpu_enabled(false);
  at::autocast::clear_cache();
  EXPECT_TRUE(low.scalar_type() == torch::kBFloat16 || low.scalar_type() == torch::kFloat);
  const double diff = (low.to(torch::kFloat) - exact).abs().max().item<double>();
  EXPECT_LT(diff, 0.05 * exact.abs().max().item<double>());
}

TEST(Llama, LoraTargetsAttentionAndMlpByTheGptsShorthands) {
  auto m = createModel(llamaConfig(), {});
  LoraConfig lora;
  lora.rank = 2;
  lora.targets = {"attn", "mlp"};
  const LoraSummary s = attachLora(*m, lora);
  EXPECT_EQ(s.layers.size(), 2u * 7u) << "q, k, v, o, gate, up and down of each block";
  lora.targets = {"q_proj"};
  auto n = createModel(llamaConfig(), {});
  EXPECT_EQ(attachLora(*n, lora).layers.size(), 2u);
}

TEST(Llama, BadSizesNameTheirKeys) {
  auto error = [](auto change) {
    ModelConfig c = llamaConfig();
    change(c);
    return test::errorOf<ConfigError>([&] { createModel(c, {}); });
  };
  EXPECT_NE(error([](ModelConfig& c) { c.nKvHead = 3; }).find("model.n_kv_head: 3 does not divide"),
            std::string::npos);
  EXPECT_NE(error([](ModelConfig& c) { c.nEmbd = 20; }).find("model.n_embd: 20"), std::string::npos);
  EXPECT_NE(error([](ModelConfig& c) { c.nLayer = 0; }).find("model.n_layer: must be >= 1"), std::string::npos);
  EXPECT_NE(error([](ModelConfig& c) {
              c.rope.scaling = RopeScaling::llama3;
              c.rope.highFreqFactor = 1;
            }).find("model.rope.high_freq_factor"),
            std::string::npos);
  torch::manual_seed(1);
  auto m = createModel(llamaConfig(), {});
  EXPECT_NE(test::errorOf<DataError>([&] { m->forward(torch::zeros({1, 17}, torch::kLong)); })
                .find("longer than model.block_size (16)"),
            std::string::npos);
}

}  // namespace
}  // namespace cohort::models
