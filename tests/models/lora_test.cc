// LoRA adapters (models/lora.h) on the GPT: an adapted model starts as its
// base, only the adapters train, targets pick layers by name, a target that
// matches nothing is refused, and merged weights compute what base +
// adapters compute.

#include "cohort/models/lora.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "util/gpt.h"

namespace cohort::models {
namespace {

GptOptions tinyBase() { return test::gptSizes(64, 16, 2, 2, 32); }

LoraConfig lora(std::vector<std::string> targets, int64_t rank = 4) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = 8;
  c.targets = std::move(targets);
  return c;
}

at::Tensor logits(Model& m, const at::Tensor& tokens) {
  torch::NoGradGuard g;
  m.eval();
  return m.forward(tokens);
}

// Gives every adapter's B random values, as training would.
void perturbAdapters(Model& m) {
  torch::NoGradGuard g;
  for (auto& [name, t] : adapterStateDict(m)) t.normal_(0, 0.05);
}

TEST(Lora, AnAdaptedModelStartsAsItsBaseAndOnlyAdaptersTrain) {
  torch::manual_seed(1);
  auto model = createGpt(tinyBase());
  const at::Tensor tokens = torch::randint(0, 64, {2, 16}, torch::kLong);
  const at::Tensor before = logits(*model, tokens);
  const int64_t all = parameterCount(*model);

  const LoraSummary s = attachLora(*model, lora({"attn", "mlp"}));
  EXPECT_TRUE(hasAdapters(*model));
  EXPECT_TRUE(torch::equal(logits(*model, tokens), before)) << "B starts at zero";
  // Per block, r * (in + out) for c_attn (32 -> 96), attn.c_proj (32 -> 32),
  // c_fc (32 -> 128) and mlp.c_proj (128 -> 32).
  const int64_t perBlock = 4 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32));
  EXPECT_EQ(s.layers.size(), 8u);
  EXPECT_EQ(s.trainable, 2 * perBlock);
  EXPECT_EQ(s.frozen, all);

  const auto trainable = trainableParameters(*model);
  EXPECT_EQ(trainable.size(), 16u);
  for (const auto& [name, t] : trainable) {
    EXPECT_TRUE(name.find(".lora_A.weight") != std::string::npos ||
                name.find(".lora_B.weight") != std::string::npos)
        << name;
  }
  // The checkpoint holds what trains: the adapters (the GPT has no buffers).
  EXPECT_EQ(trainedState(*model).size(), 16u);
  EXPECT_EQ(adapterStateDict(*model).size(), 16u);

  // Backward reaches the adapters and leaves the frozen weights without a
  // gradient.
  model->train();
  const at::Tensor loss = model->forward(tokens).logsumexp(-1).mean();
  loss.backward();
  for (const auto& p : model->named_parameters()) {
    const bool adapter = p.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(p.value().grad().defined(), adapter) << p.key();
  }
  for (const auto& [name, t] : trainable) {
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_GT(t.grad().abs().sum().item<double>(), 0) << name;
    }
  }
}

TEST(Lora, TargetsPickLayersByTheirNameParts) {
  auto adapted = [](std::vector<std::string> targets) {
    torch::manual_seed(1);
    auto model = createGpt(tinyBase());
    return attachLora(*model, lora(std::move(targets))).layers;
  };
  EXPECT_EQ(adapted({"attn"}),
            (std::vector<std::string>{"transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj",
                                      "transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj"}));
  EXPECT_EQ(adapted({"c_attn"}),
            (std::vector<std::string>{"transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"}));
  EXPECT_EQ(adapted({"h.1.mlp.c_fc"}), (std::vector<std::string>{"transformer.h.1.mlp.c_fc"}));
  EXPECT_EQ(adapted({"c_proj"}).size(), 4u) << "attn.c_proj and mlp.c_proj of both blocks";
  EXPECT_EQ(adapted({"attn", "c_attn"}).size(), 4u) << "a layer matched twice is adapted once";
  // Parts match whole: "attn" is not a part of "c_attn" alone.
  EXPECT_EQ(adapted({"mlp"}).size(), 4u);

  torch::manual_seed(1);
  auto model = createGpt(tinyBase());
  try {
    attachLora(*model, lora({"attn", "q_proj"}));
    FAIL() << "a target that matches no layer was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.lora.targets: 'q_proj' matches no layer"), std::string::npos) << what;
    EXPECT_NE(what.find("transformer.h.0.attn.c_attn"), std::string::npos) << "lists the layers: " << what;
  }
  try {
    attachLora(*model, lora({"wte"}));
    FAIL() << "the embedding is not a Linear layer";
  } catch (const ConfigError&) {
  }
}

TEST(Lora, MergedWeightsComputeWhatBasePlusAdaptersCompute) {
  torch::manual_seed(2);
  auto adapted = createGpt(tinyBase());
  const ckpt::StateDict base = publishedStateDict(*adapted);
  std::map<std::string, at::Tensor> baseCopy;
  for (const auto& [n, t] : base) baseCopy[n] = t.clone();
  attachLora(*adapted, lora({"attn", "mlp"}, 2));
  perturbAdapters(*adapted);
  const at::Tensor tokens = torch::randint(0, 64, {3, 16}, torch::kLong);
  const at::Tensor expected = logits(*adapted, tokens);
  EXPECT_FALSE(torch::allclose(expected, [&] {
    auto plain = createGpt(tinyBase());
    loadWeights(*plain, base, "base");
    return logits(*plain, tokens);
  }())) << "the adapters change the function";

  const ckpt::StateDict merged = mergedStateDict(*adapted);
  ASSERT_EQ(merged.size(), base.size()) << "the base model's names, lm_head.weight too";
  size_t changed = 0;
  for (const auto& [name, t] : merged) {
    ASSERT_TRUE(baseCopy.count(name)) << name;
    if (!torch::equal(t, baseCopy[name])) ++changed;
  }
  EXPECT_EQ(changed, 8u) << "only the adapted layers' weights";

  auto plain = createGpt(tinyBase());
  loadWeights(*plain, merged, "merged");
  EXPECT_TRUE(torch::allclose(logits(*plain, tokens), expected, 1e-5, 1e-5));
  // The frozen weights themselves are untouched by merging.
  for (const auto& p : adapted->named_parameters()) {
    if (baseCopy.count(p.key())) {
      EXPECT_TRUE(torch::equal(p.value(), baseCopy[p.key()])) << p.key();
    }
  }
}

TEST(Lora, TheFrozenDigestFollowsTheBaseWeights) {
  torch::manual_seed(3);
  auto a = createGpt(tinyBase());
  attachLora(*a, lora({"attn"}));
  torch::manual_seed(3);
  auto b = createGpt(tinyBase());
  attachLora(*b, lora({"attn"}));
  EXPECT_EQ(frozenDigest(*a), frozenDigest(*b));
  perturbAdapters(*b);
  EXPECT_EQ(frozenDigest(*a), frozenDigest(*b)) << "adapters are not part of it";
  {
    torch::NoGradGuard g;
    b->named_parameters()["transformer.ln_f.weight"].add_(1e-3);
  }
  EXPECT_NE(frozenDigest(*a), frozenDigest(*b));
}

}  // namespace
}  // namespace cohort::models
