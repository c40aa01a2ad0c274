// BERT (models/bert.h): Hugging Face's names, its forward against one
// written here from the published equations in double, padding that no
// position sees, the classification head new to a pretrained encoder, and
// recompute and bf16.

#include "cohort/models/bert.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/ckpt/safetensors.h"
#include "cohort/models/model.h"
#include "cohort/models/pretrained.h"
#include "util/errors.h"
#include "util/runs.h"
#include "util/process.h"

namespace cohort::models {
namespace {

BertOptions tinyBert(int64_t classes, int64_t pad = -1) {
  BertOptions o;
  o.vocabSize = 40;
  o.blockSize = 12;
  o.nLayer = 2;
  o.nHead = 4;
  o.nEmbd = 16;
  o.intermediate = 24;
  o.numClasses = classes;
  o.padId = pad;
  return o;
}

// The equations, in double: post-LayerNorm blocks, attention over the
// keys that are not padding, GELU (erf), and the two heads.
at::Tensor bertReference(const std::map<std::string, at::Tensor>& w, const BertOptions& o, const at::Tensor& tokens) {
  auto W = [&](const std::string& n) { return w.at(n).to(torch::kDouble); };
  auto ln = [&](const at::Tensor& x, const std::string& p) {
    const at::Tensor mu = x.mean(-1, true), var = (x - mu).pow(2).mean(-1, true);
    return (x - mu) / torch::sqrt(var + o.normEps) * W(p + ".weight") + W(p + ".bias");
  };
  auto lin = [&](const at::Tensor& x, const std::string& p) {
    return torch::matmul(x, W(p + ".weight").t()) + W(p + ".bias");
  };
  auto gelu = [](const at::Tensor& x) { return 0.5 * x * (1 + torch::erf(x / std::sqrt(2.0))); };
  const int64_t b = tokens.size(0), t = tokens.size(1), h = o.nHead, d = o.nEmbd / o.nHead;
  at::Tensor x = torch::embedding(W("bert.embeddings.word_embeddings.weight"), tokens) +
                 W("bert.embeddings.position_embeddings.weight").narrow(0, 0, t) +
                 W("bert.embeddings.token_type_embeddings.weight")[0];
  x = ln(x, "bert.embeddings.LayerNorm");
  const at::Tensor seen = o.padId >= 0 ? (tokens != o.padId) : torch::ones_like(tokens, torch::kBool);
  for (int64_t l = 0; l < o.nLayer; ++l) {
    const std::string p = "bert.encoder.layer." + std::to_string(l) + ".";
    auto heads = [&](const at::Tensor& m) { return m.view({b, t, h, d}); };
    const at::Tensor q = heads(lin(x, p + "attention.self.query"));
    const at::Tensor k = heads(lin(x, p + "attention.self.key"));
    const at::Tensor v = heads(lin(x, p + "attention.self.value"));
    at::Tensor s = torch::einsum("bqhd,bkhd->bhqk", {q, k}) / std::sqrt(double(d));
    s = s.masked_fill(seen.logical_not().view({b, 1, 1, t}), -INFINITY).softmax(-1);
    const at::Tensor y = torch::einsum("bhqk,bkhd->bqhd", {s, v}).reshape({b, t, o.nEmbd});
    x = ln(lin(y, p + "attention.output.dense") + x, p + "attention.output.LayerNorm");
    x = ln(lin(gelu(lin(x, p + "intermediate.dense")), p + "output.dense") + x, p + "output.LayerNorm");
  }
  if (o.numClasses > 0) {
    return lin(torch::tanh(lin(x.select(1, 0), "bert.pooler.dense")), "classifier");
  }
  const at::Tensor hdn = ln(gelu(lin(x, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm");
  return torch::matmul(hdn, W("bert.embeddings.word_embeddings.weight").t()) + W("cls.predictions.bias");
}

TEST(Bert, NamesAndCountAreHuggingFaces) {
  auto mlm = createBert(tinyBert(0));
  const auto w = test::tensorsByName(*mlm);
  const int64_t C = 16, I = 24, V = 40, P = 12;
  const int64_t layer = 4 * (C * C + C) + 2 * 2 * C + (C * I + I) + (I * C + C);
  const int64_t embeddings = V * C + P * C + 2 * C + 2 * C;
  EXPECT_EQ(parameterCount(*mlm), embeddings + 2 * layer + (C * C + C + 2 * C + V));
  for (const char* n : {"bert.encoder.layer.1.attention.self.query.weight", "bert.encoder.layer.0.output.LayerNorm.bias",
                        "bert.encoder.layer.0.intermediate.dense.weight", "cls.predictions.transform.dense.weight",
                        "cls.predictions.bias"}) {
    EXPECT_EQ(w.count(n), 1u) << n;
  }
  // The decoder is the embedding and its bias cls.predictions.bias, named
  // twice in the published state dict as transformers names them.
  EXPECT_EQ(publishedStateDict(*mlm).size(), w.size() + 2);
  auto classify = createBert(tinyBert(3));
  const auto c = test::tensorsByName(*classify);
  EXPECT_EQ(c.at("classifier.weight").sizes(), (std::vector<int64_t>{3, C}));
  EXPECT_EQ(c.count("bert.pooler.dense.weight"), 1u);
  EXPECT_EQ(c.count("cls.predictions.bias"), 0u);
}

TEST(Bert, ForwardIsTheEquations) {
  for (int64_t classes : {0, 3}) {
    SCOPED_TRACE(classes);
    const BertOptions o = tinyBert(classes, /*pad=*/0);
    torch::manual_seed(2);
    auto m = createBert(o);
    m->eval();
    {
      torch::NoGradGuard g;  // LayerNorms and biases away from their initial ones and zeros
      for (auto& p : m->named_parameters()) {
        if (p.key().find("LayerNorm") != std::string::npos || p.key().find("bias") != std::string::npos) {
          p.value().uniform_(0.5, 1.5);
        }
      }
    }
    at::Tensor tokens = torch::randint(1, 40, {3, 12}, torch::kLong);
    tokens[1].narrow(0, 8, 4).fill_(0);  // padding
    torch::NoGradGuard g;
    const at::Tensor got = m->forward(tokens).to(torch::kDouble);
    const at::Tensor want = bertReference(test::tensorsByName(*m), o, tokens);
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-4);
  }
}

TEST(Bert, PaddingChangesNothingTheOtherPositionsSee) {
  torch::manual_seed(5);
  auto m = createBert(tinyBert(3, /*pad=*/0));
  m->eval();
  torch::NoGradGuard g;
  const at::Tensor text = torch::randint(1, 40, {1, 7}, torch::kLong);
  const at::Tensor padded = torch::cat({text, torch::zeros({1, 5}, torch::kLong)}, 1);
  EXPECT_LT((m->forward(text) - m->forward(padded)).abs().max().item<double>(), 1e-5);
}

TEST(Bert, AClassifierFineTunedFromAMaskedLmKeepsItsNewHead) {
  torch::manual_seed(1);
  auto mlm = createBert(tinyBert(0));
  torch::manual_seed(9);
  auto classify = createBert(tinyBert(3));
  const at::Tensor head = test::tensorsByName(*classify).at("classifier.weight").clone();
  // The masked-LM head left out, as openPretrained's reading of a bert file
  // into a classifier does (hf_bert.h).
  ckpt::StateDict encoder = publishedStateDict(*mlm);
  encoder.erase(std::remove_if(encoder.begin(), encoder.end(), [](const auto& e) { return e.first.rfind("cls.", 0) == 0; }),
                encoder.end());
  loadWeights(*classify, encoder, "mlm.pt");
  const auto after = test::tensorsByName(*classify);
  EXPECT_TRUE(torch::equal(after.at("classifier.weight"), head));
  EXPECT_TRUE(torch::equal(after.at("bert.encoder.layer.1.output.dense.weight"),
                           test::tensorsByName(*mlm).at("bert.encoder.layer.1.output.dense.weight")));
  // The encoder itself is not optional: a file without it is refused.
  ckpt::StateDict partial = encoder;
  partial.erase(partial.begin());
  EXPECT_THROW(loadWeights(*classify, partial, "partial.pt"), DataError);
}

TEST(Bert, RecomputeGivesTheSameGradientsAndBf16RunsNearFloat32) {
  std::map<std::string, at::Tensor> grads[2];
  const at::Tensor tokens = torch::randint(0, 40, {2, 12}, torch::kLong);
  for (bool again : {false, true}) {
    BertOptions o = tinyBert(0);
    o.recompute = again;
    torch::manual_seed(8);
    auto m = createBert(o);
    m->forward(tokens).logsumexp(-1).sum().backward();
    for (auto& p : m->named_parameters()) grads[again].emplace(p.key(), p.value().grad().clone());
  }
  for (const auto& [name, g] : grads[0]) EXPECT_TRUE(torch::allclose(g, grads[1].at(name), 1e-5, 1e-6)) << name;
  torch::manual_seed(8);
  auto m = createBert(tinyBert(3));
  m->eval();
  torch::NoGradGuard g;
  const at::Tensor exact = m->forward(tokens);
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(torch::kBFloat16);
  const at::Tensor low = m->forward(tokens);
  at::autocast::set_cpu_enabled(false);
  at::autocast::clear_cache();
  EXPECT_LT((low.to(torch::kFloat) - exact).abs().max().item<double>(), 0.05 * exact.abs().max().item<double>() + 0.02);
}

// Hugging Face's other BERT files: BertForPreTraining's (the published
// bert-base layout: a pooler, the next-sentence head, position_ids) into a
// masked LM; BertModel's (no "bert." prefix, TensorFlow-era gamma/beta)
// into a classifier, whose head starts as built.
TEST(Bert, HuggingFacesPretrainingAndEncoderFilesLoad) {
  test::TempDir dir;
  torch::manual_seed(3);
  auto source = createBert(tinyBert(3));
  const auto w = test::tensorsByName(*source);
  ckpt::StateDict pretraining, encoder;
  for (const auto& [name, t] : w) {
    if (name.rfind("classifier.", 0) == 0) continue;
    pretraining.emplace_back(name, t);
    std::string bare = name.substr(std::string("bert.").size());
    if (bare.size() > 17 && bare.compare(bare.size() - 17, 17, "LayerNorm.weight") == 0) {
      bare = bare.substr(0, bare.size() - 6) + "gamma";
    }
    encoder.emplace_back(bare, t);
  }
  auto mlm = createBert(tinyBert(0));
  for (const auto& [name, t] : test::tensorsByName(*mlm)) {
    if (name.rfind("cls.", 0) == 0) pretraining.emplace_back(name, t.clone());
  }
  pretraining.emplace_back("cls.predictions.decoder.weight", w.at("bert.embeddings.word_embeddings.weight"));
  pretraining.emplace_back("cls.seq_relationship.weight", torch::zeros({2, 16}));
  pretraining.emplace_back("cls.seq_relationship.bias", torch::zeros({2}));
  pretraining.emplace_back("bert.embeddings.position_ids", torch::arange(12, torch::kLong).view({1, 12}));
  ckpt::saveSafetensors(pretraining, dir.file("pretraining.safetensors"));
  ckpt::saveSafetensors(encoder, dir.file("encoder.safetensors"));

  ModelConfig c;
  c.arch = ModelArch::bert;
  c.vocabSize = 40;
  c.blockSize = 12;
  c.nLayer = 2;
  c.nHead = 4;
  c.nEmbd = 16;
  c.intermediateSize = 24;
  auto file = openPretrained(dir.file("pretraining.safetensors"), c);
  loadWeights(*mlm, *file, "pretraining.safetensors");
  EXPECT_TRUE(torch::equal(test::tensorsByName(*mlm).at("bert.encoder.layer.0.output.dense.weight"),
                           w.at("bert.encoder.layer.0.output.dense.weight")));
  c.task = BertTask::classify;
  c.numClasses = 3;
  torch::manual_seed(4);
  auto classify = createBert(tinyBert(3));
  const at::Tensor head = test::tensorsByName(*classify).at("classifier.weight").clone();
  auto bare = openPretrained(dir.file("encoder.safetensors"), c);
  loadWeights(*classify, *bare, "encoder.safetensors");
  const auto got = test::tensorsByName(*classify);
  EXPECT_TRUE(torch::equal(got.at("bert.embeddings.LayerNorm.weight"), w.at("bert.embeddings.LayerNorm.weight")));
  EXPECT_TRUE(torch::equal(got.at("bert.pooler.dense.weight"), w.at("bert.pooler.dense.weight")));
  EXPECT_TRUE(torch::equal(got.at("classifier.weight"), head));
}

TEST(Bert, BadSizesNameTheirKeys) {
  BertOptions o = tinyBert(0);
  o.nHead = 3;
  EXPECT_NE(test::errorOf<ConfigError>([&] { createBert(o); }).find("model.n_embd: 16 is not divisible"),
            std::string::npos);
  auto m = createBert(tinyBert(0));
  EXPECT_NE(test::errorOf<DataError>([&] { m->forward(torch::zeros({1, 13}, torch::kLong)); })
                .find("longer than model.block_size (12)"),
            std::string::npos);
}

}  // namespace
}  // namespace cohort::models
