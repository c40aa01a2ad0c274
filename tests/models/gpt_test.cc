// The GPT module (models/gpt.h): GPT-2's size and names, causality, its
// initialization, bad sizes and inputs, and that it learns. The comparison
// with PyTorch's module of the same architecture is in
// ckpt/python_interop_test.cc.

#include "cohort/models/gpt.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>
#include <string>

#include "cohort/core/error.h"
#include "util/gpt.h"

namespace cohort::models {
namespace {

GptOptions tiny() { return test::gptSizes(64, 16, 2, 2, 32); }

std::set<std::string> names(const torch::nn::Module& m) {
  std::set<std::string> out;
  for (const auto& item : m.named_parameters()) out.insert(item.key());
  return out;
}

TEST(Gpt, Gpt2SmallHasItsParameterCountWithTheHeadTiedOnce) {
  // GPT-2 "124M": vocab 50257, 1024 positions, 12 layers of 768 with 12 heads.
  GptOptions o;
  o.vocabSize = 50257;
  o.blockSize = 1024;
  o.nLayer = 12;
  o.nHead = 12;
  o.nEmbd = 768;
  EXPECT_EQ(parameterCount(*createGpt(o)), 124439808);
}

TEST(Gpt, ParameterNamesAreGpt2s) {
  const auto n = names(*createGpt(tiny()));
  for (const char* expected :
       {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
        "transformer.h.0.ln_1.bias", "transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_attn.bias",
        "transformer.h.1.attn.c_proj.weight", "transformer.h.0.ln_2.bias", "transformer.h.1.mlp.c_fc.weight",
        "transformer.h.1.mlp.c_proj.bias", "transformer.ln_f.weight", "transformer.ln_f.bias"}) {
    EXPECT_EQ(n.count(expected), 1u) << expected;
  }
  EXPECT_EQ(n.count(kTiedHeadName), 0u) << "the tied head is registered once, as the embedding";
  EXPECT_EQ(n.size(), 4u + 2 * 12u);  // wte, wpe, ln_f x2; per block 12 tensors

  GptOptions noBias = tiny();
  noBias.bias = false;
  for (const auto& name : names(*createGpt(noBias))) {
    EXPECT_EQ(name.find(".bias"), std::string::npos) << name;
  }
}

TEST(Gpt, APositionSeesOnlyThePast) {
  torch::manual_seed(1);
  auto model = createGpt(tiny());
  model->eval();
  torch::NoGradGuard noGrad;
  const at::Tensor tokens = torch::randint(0, 64, {2, 16}, torch::kLong);
  const at::Tensor logits = model->forward(tokens);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 16, 64}));
  at::Tensor changed = tokens.clone();
  changed.index_put_({0, 5}, (tokens.index({0, 5}) + 1) % 64);
  const at::Tensor other = model->forward(changed);
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::equal(other.index({0, Slice(0, 5)}), logits.index({0, Slice(0, 5)})))
      << "a change at position 5 reached an earlier position";
  EXPECT_FALSE(torch::allclose(other.index({0, 5}), logits.index({0, 5})));
  EXPECT_FALSE(torch::allclose(other.index({0, 15}), logits.index({0, 15})));
  EXPECT_TRUE(torch::equal(other.index({1}), logits.index({1})));
}

TEST(Gpt, InitializationIsGpt2s) {
  GptOptions o = tiny();
  o.nEmbd = 256;
  o.nHead = 4;
  o.nLayer = 8;
  torch::manual_seed(2);
  auto model = createGpt(o);
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    if (name.find(".ln_") != std::string::npos) continue;  // LayerNorms: ones and zeros
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      EXPECT_EQ(p.abs().max().item<double>(), 0.0) << name;
      continue;
    }
    const bool residual = name.find("c_proj.weight") != std::string::npos;
    const double expected = residual ? 0.02 / std::sqrt(16.0) : 0.02;
    EXPECT_NEAR(p.std().item<double>(), expected, 0.1 * expected) << name;
  }
}

TEST(Gpt, BadSizesAndInputsNameWhatIsWrong) {
  GptOptions o = tiny();
  o.nHead = 3;
  try {
    createGpt(o);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_embd: 32 is not divisible by model.n_head (3)"),
              std::string::npos)
        << e.what();
  }
  o = tiny();
  o.nLayer = 0;
  EXPECT_THROW(createGpt(o), ConfigError);
  auto model = createGpt(tiny());
  try {
    model->forward(torch::zeros({1, 17}, torch::kLong));
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("17 tokens is longer than model.block_size (16)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(model->forward(torch::zeros({16}, torch::kLong)), DataError);
}

TEST(Gpt, LearnsToContinueASequence) {
  // Next-token prediction on one fixed batch: the loss starts near ln(64)
  // and falls far below it once gradients reach every layer.
  torch::manual_seed(3);
  auto model = createGpt(tiny());
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  const at::Tensor seq = torch::randint(0, 64, {4, 17}, torch::kLong);
  using torch::indexing::Slice;
  const at::Tensor input = seq.index({Slice(), Slice(0, 16)});
  const at::Tensor target = seq.index({Slice(), Slice(1, 17)});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    const at::Tensor logits = model->forward(input);
    const at::Tensor loss = torch::cross_entropy_loss(logits.reshape({-1, 64}), target.reshape({-1}));
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_NEAR(first, std::log(64.0), 0.5);
  EXPECT_LT(last, 0.5) << "from " << first;
}

}  // namespace
}  // namespace cohort::models
