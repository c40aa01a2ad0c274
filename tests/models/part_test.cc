// A model built in parts (models::ModelPart, a pipeline's stages): each part
// holds exactly its blocks, with the whole model's names and, for the same
// seed, its values; the parts' forwards chained compute the whole model's.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "cohort/models/llama.h"
#include "cohort/models/model.h"
#include "util/gpt.h"

namespace cohort::models {
namespace {

std::vector<ModelPart> partsOf(const std::vector<int64_t>& split) {
  std::vector<ModelPart> parts;
  int64_t at = 0;
  for (size_t s = 0; s < split.size(); ++s) {
    ModelPart p;
    p.firstBlock = at;
    p.endBlock = at + split[s];
    p.input = s == 0;
    p.output = s + 1 == split.size();
    at += split[s];
    parts.push_back(p);
  }
  return parts;
}

ModelConfig gptConfig() {
  ModelConfig c;
  c.arch = ModelArch::gpt;
  c.nLayer = 4;
  c.nHead = 2;
  c.nEmbd = 12;
  c.blockSize = 8;
  c.vocabSize = 30;
  return c;
}

ModelConfig llamaConfig(bool tied) {
  ModelConfig c = gptConfig();
  c.arch = ModelArch::llama;
  c.nHead = 4;
  c.nKvHead = 2;
  c.nEmbd = 16;
  c.tieEmbeddings = tied;
  return c;
}

ModelConfig resnetConfig() {
  ModelConfig c;
  c.arch = ModelArch::resnet18;
  c.numClasses = 5;
  c.smallInput = true;
  return c;
}

// Builds the whole model and its parts for `split` from the same seed;
// checks names and values, then that the chained forwards agree.
void checkParts(const ModelConfig& config, const InputShape& input, const std::vector<int64_t>& split,
                const at::Tensor& x) {
  torch::manual_seed(11);
  auto whole = createModel(config, input);
  std::map<std::string, at::Tensor> wholeDict;
  for (const auto& [name, t] : publishedStateDict(*whole)) wholeDict.emplace(name, t);
  std::vector<std::shared_ptr<Model>> parts;
  std::map<std::string, int> seen;
  for (const ModelPart& p : partsOf(split)) {
    torch::manual_seed(11);
    parts.push_back(createModel(config, input, p));
    for (const auto& [name, t] : publishedStateDict(*parts.back())) {
      ++seen[name];
      auto it = wholeDict.find(name);
      ASSERT_NE(it, wholeDict.end()) << name << " is not the whole model's";
      EXPECT_TRUE(torch::equal(it->second, t)) << name << " differs from the whole model's";
    }
  }
  for (const auto& [name, t] : wholeDict) {
    EXPECT_GE(seen[name], 1) << name << " is in no part";
    // Only the tied embedding (and its second name) is held twice: by the
    // first and the last part.
    if (seen[name] > 1) {
      const std::vector<std::string> tied = tiedAcrossStages(config);
      EXPECT_TRUE(std::find(tied.begin(), tied.end(), name) != tied.end() || name == kTiedHeadName) << name;
    }
  }
  torch::NoGradGuard noGrad;
  whole->eval();
  at::Tensor y = x;
  for (auto& p : parts) {
    p->eval();
    y = p->forward(y);
  }
  const at::Tensor expected = whole->forward(x);
  ASSERT_EQ(y.sizes(), expected.sizes());
  EXPECT_TRUE(torch::allclose(y, expected, 1e-6, 1e-6)) << (y - expected).abs().max().item<double>();
}

TEST(ModelParts, GptStagesHoldTheirBlocksWithTheWholeModelsValues) {
  const at::Tensor tokens = torch::randint(0, 30, {3, 8}, torch::kLong);
  for (const std::vector<int64_t>& split : {std::vector<int64_t>{2, 2}, {1, 3}, {1, 1, 2}, {1, 1, 1, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(split));
    checkParts(gptConfig(), {}, split, tokens);
  }
  // What a stage holds: its blocks, the first the embeddings, the last the
  // final norm and the head (the token embedding, tied).
  auto parts = partsOf({1, 2, 1});
  torch::manual_seed(1);
  auto middle = createModel(gptConfig(), {}, parts[1]);
  std::vector<std::string> names;
  for (const auto& [name, t] : ckpt::stateDict(*middle)) names.push_back(name);
  EXPECT_EQ(names.front(), "transformer.h.1.ln_1.weight");
  EXPECT_EQ(names.back(), "transformer.h.2.mlp.c_proj.bias");
  EXPECT_EQ(middle->shardingUnits(), (std::vector<std::string>{"transformer.h.1", "transformer.h.2"}));
  EXPECT_TRUE(middle->tiedNames().empty());
  auto last = createModel(gptConfig(), {}, parts[2]);
  EXPECT_EQ(last->tiedNames().size(), 1u);
  // A middle stage takes the residual stream, and says so when given tokens.
  EXPECT_THROW(middle->forward(torch::zeros({2, 8}, torch::kLong)), DataError);
}

TEST(ModelParts, LlamaStagesHoldTheirBlocksWithTheWholeModelsValues) {
  const at::Tensor tokens = torch::randint(0, 30, {3, 8}, torch::kLong);
  for (bool tied : {false, true}) {
    for (const std::vector<int64_t>& split : {std::vector<int64_t>{2, 2}, {1, 1, 2}}) {
      SCOPED_TRACE(::testing::PrintToString(split) + (tied ? " tied" : " untied"));
      checkParts(llamaConfig(tied), {}, split, tokens);
    }
    // The last stage holds the head; the embedding too only when it is the head.
    auto parts = partsOf({2, 2});
    torch::manual_seed(1);
    const auto last = ckpt::stateDict(*createModel(llamaConfig(tied), {}, parts[1]));
    const auto has = [&](const std::string& name) {
      return std::any_of(last.begin(), last.end(), [&](const auto& e) { return e.first == name; });
    };
    EXPECT_EQ(has("model.embed_tokens.weight"), tied);
    EXPECT_EQ(has("lm_head.weight"), !tied);
    EXPECT_TRUE(has("model.norm.weight"));
    EXPECT_FALSE(has("model.layers.0.mlp.up_proj.weight"));
  }
}

TEST(ModelParts, ResNetStagesHoldTheirLayerGroupsWithTheWholeModelsValues) {
  const at::Tensor images = torch::randn({2, 3, 16, 16});
  for (const std::vector<int64_t>& split : {std::vector<int64_t>{2, 2}, {1, 3}, {1, 1, 1, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(split));
    checkParts(resnetConfig(), {3, 16, 16}, split, images);
  }
}

TEST(ModelParts, AStateDictIsCutToWhatAPartHolds) {
  torch::manual_seed(3);
  auto whole = createModel(gptConfig(), {});
  auto parts = partsOf({2, 2});
  auto last = createModel(gptConfig(), {}, parts[1]);
  // PyTorch's state dict of the tied module names the head twice.
  const ckpt::StateDict mine = partOfStateDict(*last, publishedStateDict(*whole));
  std::vector<std::string> names;
  for (const auto& [name, t] : mine) names.push_back(name);
  EXPECT_EQ(names.front(), "transformer.wte.weight");
  EXPECT_EQ(names.back(), kTiedHeadName);
  EXPECT_EQ(std::count(names.begin(), names.end(), "transformer.wpe.weight"), 0);
  EXPECT_EQ(std::count(names.begin(), names.end(), "transformer.h.1.attn.c_attn.weight"), 0);
  EXPECT_NO_THROW(loadWeights(*last, mine, "whole.pt"));
}

// Keeps what a model built unit by unit hands over.
struct Collect : UnitSink {
  void take(const std::string& unit, std::vector<std::pair<std::string, at::Tensor>> values) override {
    units.push_back(unit);
    for (auto& [name, t] : values) got.emplace(name, t);
  }
  std::vector<std::string> units;
  std::map<std::string, at::Tensor> got;
};

// ZeRO stage 3's build: every block's values go to the sink, one block at a
// time and bitwise the whole model's of the seed; the model keeps those
// parameters without storage and the rest with their values; a pipeline
// stage's blocks likewise.
TEST(ModelParts, BuiltUnitByUnitTheBlocksGoToTheSinkWithTheWholeModelsValues) {
  struct Arch {
    ModelConfig config;
    std::string blocks;
    size_t perBlock;
  };
  for (const Arch& arch : {Arch{gptConfig(), "transformer.h.", 12}, Arch{llamaConfig(false), "model.layers.", 9}}) {
    for (const std::vector<int64_t>& split : {std::vector<int64_t>{4}, {1, 3}}) {
      SCOPED_TRACE(::testing::PrintToString(split) + " " + arch.blocks);
      torch::manual_seed(5);
      auto whole = createModel(arch.config, {});
      std::map<std::string, at::Tensor> expected;
      for (const auto& [name, t] : ckpt::stateDict(*whole)) expected.emplace(name, t);
      ModelPart part = partsOf(split).back();
      if (split.size() == 1) part = ModelPart{};
      Collect sink;
      part.sink = &sink;
      torch::manual_seed(5);
      auto built = createModel(arch.config, {}, part);
      EXPECT_EQ(sink.units, built->shardingUnits());
      for (const auto& [name, t] : ckpt::stateDict(*built)) {
        const bool inUnit = name.rfind(arch.blocks, 0) == 0;
        EXPECT_EQ(hasStorage(t), !inUnit) << name;
        const at::Tensor value = inUnit ? sink.got.at(name) : t;
        EXPECT_TRUE(torch::equal(value, expected.at(name))) << name;
      }
      EXPECT_EQ(sink.got.size(), static_cast<size_t>(split.back()) * arch.perBlock);
    }
  }
}

TEST(ModelParts, OnlyModelsWithBlocksCanBeBuiltInParts) {
  ModelConfig cnn;
  cnn.arch = ModelArch::simpleCnn;
  ModelPart part;
  part.endBlock = 1;
  part.output = false;
  EXPECT_THROW(createModel(cnn, {1, 8, 8}, part), ConfigError);
  ModelConfig gpt = gptConfig();
  part.firstBlock = 3;
  part.endBlock = 6;  // past n_layer
  EXPECT_THROW(createModel(gpt, {}, part), ConfigError);
}

}  // namespace
}  // namespace cohort::models
