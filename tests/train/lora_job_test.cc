// model.lora with real processes: 2 ranks fine-tune adapters on a frozen
// GPT from model.init_from; only the adapters train, are checkpointed (a
// killed rank resumes to bitwise the same adapters) and saved; the merged
// model/final.pt computes what base + adapters compute; `cohort generate`
// samples from base + adapters; without model.init_from the random frozen
// weights are kept in model/base.pt and checked; mistakes exit 2 naming
// the key.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "cohort/models/lora.h"
#include "cohort/serve/model.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/runs.h"
#include "util/gpt.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

models::GptOptions gptOptions() { return test::gptSizes(256, 32, 1, 2, 48); }

LoraConfig loraConfig() {
  LoraConfig c;
  c.rank = 4;
  c.alpha = 8;
  c.targets = {"attn", "mlp"};
  return c;
}

std::map<std::string, at::Tensor> byName(const ckpt::StateDict& d) { return {d.begin(), d.end()}; }

class LoraJob : public ::testing::Test {
 protected:
  test::TempDir dir;

  // The frozen base (a GPT as a pretraining run's final.pt names it) and
  // the tokenized text to fine-tune on.
  void SetUp() override {
    writeBase(11);
    text = test::corpus(30'000);
    test::writeText(dir.file("corpus.txt"), text);
    auto tok = test::cohort({"data", "tokenize", dir.file("corpus.txt"), dir.file("tok"), "--no-progress"});
    ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  }

  std::string text;

  // A random GPT whose token embedding (and so the tied head) is 5x GPT-2's
  // scale: adapters on it can move the logits far enough to learn.
  void writeBase(uint64_t seed, int64_t layers = 1, const std::string& name = "base.pt") {
    torch::manual_seed(seed);
    models::GptOptions o = gptOptions();
    o.nLayer = layers;
    auto base = models::createGpt(o);
    {
      torch::NoGradGuard g;
      base->named_parameters()["transformer.wte.weight"].mul_(5.0);
    }
    ckpt::saveStateDict(models::publishedStateDict(*base), dir.file(name));
  }

  // Mean next-byte loss of `model` on the held-out tail of
  // the text, in windows of 32 targets as evaluation reads them.
  double heldOutLoss(models::Model& model) {
    const std::string tail = text.substr(27'000);
    std::vector<int64_t> bytes(tail.begin(), tail.end());
    const int64_t windows = (static_cast<int64_t>(bytes.size()) - 33) / 32 + 1;
    const at::Tensor all = torch::tensor(bytes, torch::kLong);
    at::Tensor x = torch::stack([&] {
      std::vector<at::Tensor> w;
      for (int64_t k = 0; k < windows; ++k) w.push_back(all.narrow(0, 32 * k, 33));
      return w;
    }());
    torch::NoGradGuard g;
    model.eval();
    const at::Tensor logits = model.forward(x.narrow(1, 0, 32));
    return torch::nn::functional::cross_entropy(logits.flatten(0, 1), x.narrow(1, 1, 32).flatten())
        .item<double>();
  }

  std::string job() {
    const std::string path = dir.file("lora.yaml");
    test::writeText(path, R"(name: lora
model:
  arch: gpt
  n_layer: 1
  n_head: 2
  n_embd: 48
  block_size: 32
  init_from: )" + dir.file("base.pt") + R"(
  lora: {rank: 4, alpha: 8, targets: [attn, mlp]}
data:
  train: {kind: tokens, path: )" + dir.file("tok/train") + R"(}
  eval: {kind: tokens, path: )" + dir.file("tok/val") + R"(}
  loader_threads: 1
distribution: {procs_per_node: 2, max_restarts: 2}
training:
  epochs: 3
  max_steps: 60
  batch_size: 16
  seed: 5
  optimizer: {name: adamw, lr: 0.01}
output: {progress: off}
checkpoint: {every_steps: 3, when_behind: wait, keep_last: 2}
)");
    return path;
  }

  test::ProcessResult run(const std::string& tag, std::vector<std::string> more = {},
                          const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> args{"run", job(), "--run-dir", dir.file(tag)};
    for (auto& m : more) args.push_back(std::move(m));
    return test::cohort(args, env);
  }
};

TEST_F(LoraJob, AdaptersAloneTrainAreCheckpointedAndMergeIntoTheFrozenBase) {
  auto r = run("run", {"--set", "output.merge_lora=true"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();

  // r * (in + out) for c_attn (48 -> 144), attn.c_proj (48 -> 48), c_fc
  // (48 -> 192), mlp.c_proj (192 -> 48).
  const auto summary = nlohmann::json::parse(test::readText(dir.file("run/summary.json")));
  EXPECT_EQ(summary["trainable_parameters"].get<int64_t>(), 4 * ((48 + 144) + (48 + 48) + (48 + 192) + (192 + 48)));
  // The frozen weights did not move, bit for bit: their digest after
  // training is that of base.pt's weights.
  {
    auto expected = models::createGpt(gptOptions());
    models::loadWeights(*expected, ckpt::readStateDict(dir.file("base.pt")), "base.pt");
    models::attachLora(*expected, loraConfig());
    EXPECT_EQ(summary["lora_base_digest"].get<std::string>(), models::frozenDigest(*expected));
  }

  // The adapters learn: the held-out loss falls well below the frozen
  // base's.
  auto frozen = models::createGpt(gptOptions());
  models::loadWeights(*frozen, ckpt::readStateDict(dir.file("base.pt")), "base.pt");
  const double baseLoss = heldOutLoss(*frozen);
  const double loss = summary["eval"]["loss"].get<double>();
  RecordProperty("validation_loss", std::to_string(loss));
  RecordProperty("base_validation_loss", std::to_string(baseLoss));
  EXPECT_LT(loss, 0.8 * baseLoss);  // measured: 3.83 against 5.95

  const ckpt::StateDict adapters = ckpt::readStateDict(dir.file("run/model/adapters.pt"));
  ASSERT_EQ(adapters.size(), 8u);
  for (const auto& [name, t] : adapters) {
    EXPECT_TRUE(name.find(".lora_A.weight") != std::string::npos || name.find(".lora_B.weight") != std::string::npos)
        << name;
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_GT(t.abs().max().item<double>(), 0) << name << " trained";
    }
  }

  // Checkpoints hold only what trains: the adapters and their Adam state.
  const std::string ckptDir = dir.file("run/checkpoints/step-60");
  ASSERT_TRUE(fs::exists(ckptDir)) << ckptDir;
  const ckpt::StateDict model = ckpt::readTensorFile(ckptDir + "/model.bin").tensors;
  ASSERT_EQ(model.size(), adapters.size());
  for (size_t k = 0; k < model.size(); ++k) {
    EXPECT_EQ(model[k].first, adapters[k].first);
    EXPECT_TRUE(torch::equal(model[k].second, adapters[k].second)) << model[k].first;
  }
  for (const auto& [name, t] : ckpt::readTensorFile(ckptDir + "/optimizer.bin").tensors) {
    EXPECT_NE(name.find(".lora_"), std::string::npos) << "optimizer state of a frozen weight: " << name;
  }

  // final.pt is the base with B A merged in: every tensor but the adapted
  // weights is the base's bit for bit, and those are base + 2 B A (the
  // frozen weights did not move).
  const auto base = byName(ckpt::readStateDict(dir.file("base.pt")));
  const auto lora = byName(adapters);
  const ckpt::StateDict merged = ckpt::readStateDict(dir.file("run/model/final.pt"));
  ASSERT_EQ(merged.size(), base.size());
  int adapted = 0;
  for (const auto& [name, t] : merged) {
    ASSERT_TRUE(base.count(name)) << name;
    const std::string layer = name.substr(0, name.size() - std::string(".weight").size());
    if (lora.count(layer + ".lora_A.weight")) {
      ++adapted;
      const at::Tensor expected =
          base.at(name) + torch::matmul(lora.at(layer + ".lora_B.weight"), lora.at(layer + ".lora_A.weight")) * 2.0;
      EXPECT_TRUE(torch::allclose(t, expected, 0, 1e-6)) << name;
      EXPECT_FALSE(torch::equal(t, base.at(name))) << name;
    } else {
      EXPECT_TRUE(torch::equal(t, base.at(name))) << name << " changed";
    }
  }
  EXPECT_EQ(adapted, 4);

  // The merged model computes what base + adapters compute.
  auto plain = models::createGpt(gptOptions());
  models::loadWeights(*plain, merged, "final.pt");
  auto withAdapters = models::createGpt(gptOptions());
  models::loadWeights(*withAdapters, ckpt::readStateDict(dir.file("base.pt")), "base.pt");
  models::attachLora(*withAdapters, loraConfig());
  ckpt::loadStateDict(models::adapterStateDict(*withAdapters), adapters, "adapters.pt");
  plain->eval();
  withAdapters->eval();
  const at::Tensor tokens = torch::randint(0, 256, {4, 32}, torch::kLong);
  torch::NoGradGuard g;
  // Within float32's rounding of (W + s B A) x against W x + s B (A x),
  // carried through every block and softmax (about 1e-5 of logits near 4),
  // and far below what the adapters change: the base alone is compared too.
  auto baseOnly = models::createGpt(gptOptions());
  models::loadWeights(*baseOnly, ckpt::readStateDict(dir.file("base.pt")), "base.pt");
  baseOnly->eval();
  const at::Tensor merged_out = plain->forward(tokens), adapted_out = withAdapters->forward(tokens);
  EXPECT_TRUE(torch::allclose(merged_out, adapted_out, 1e-4, 1e-4))
      << (merged_out - adapted_out).abs().max().item<double>();
  const double byAdapters = (baseOnly->forward(tokens) - adapted_out).abs().max().item<double>();
  EXPECT_GT(byAdapters, 1e-2) << "the adapters change the logits too little for the comparison to tell";
}

TEST_F(LoraJob, AKilledRankResumesToBitwiseTheSameAdaptersAndGenerateUsesThem) {
  ASSERT_EQ(run("reference", {"--set", "training.max_steps=18"}).exitCode, 0);
  auto r = run("killed", {"--set", "training.max_steps=18"}, {{"COHORT_FAULT", "kill@rank1:step7"}});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto summary = nlohmann::json::parse(test::readText(dir.file("killed/summary.json")));
  EXPECT_EQ(summary["restart_count"], 1) << summary.dump(2);
  ASSERT_TRUE(summary.contains("resumed_from")) << summary.dump(2);
  EXPECT_EQ(test::maxDifference(ckpt::readStateDict(dir.file("reference/model/adapters.pt")),
                                ckpt::readStateDict(dir.file("killed/model/adapters.pt"))),
            0.0);
  EXPECT_FALSE(fs::exists(dir.file("reference/model/final.pt"))) << "merge_lora is off";

  // Without final.pt, generate samples from model.init_from + adapters.pt.
  auto gen = test::cohort({"generate", dir.file("reference"), "--prompt", "the ", "--tokens", "10"});
  ASSERT_EQ(gen.exitCode, 0) << gen.describe();
  EXPECT_NE(gen.err.find(dir.file("base.pt") + " + " + dir.file("reference/model/adapters.pt")), std::string::npos)
      << gen.err;
  EXPECT_EQ(gen.out.size(), 4u + 10u + 1u) << gen.out;

  // Resuming over other frozen weights is refused, naming both digests.
  writeBase(12);
  auto refused = run("other", {"--set", "training.max_steps=18", "--resume", dir.file("reference/checkpoints/step-18")});
  EXPECT_EQ(refused.exitCode, 2) << refused.describe();
  EXPECT_NE(refused.err.find("its LoRA adapters were trained on other frozen weights"), std::string::npos)
      << refused.err;
}

TEST_F(LoraJob, WithoutInitFromTheRandomFrozenBaseIsKeptAndChecked) {
  auto r = run("random", {"--set", "model.init_from=", "--set", "training.max_steps=6"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string kept = dir.file("random/model/base.pt");
  ASSERT_TRUE(fs::exists(kept)) << r.describe();
  const auto summary = nlohmann::json::parse(test::readText(dir.file("random/summary.json")));
  ASSERT_TRUE(summary.contains("lora_base_digest")) << summary.dump(2);

  // base.pt holds the frozen weights training ran with: loaded and adapted,
  // their digest is the one training recorded (and not model.init_from's).
  auto model = models::createGpt(gptOptions());
  models::loadWeights(*model, ckpt::readStateDict(kept), kept);
  models::attachLora(*model, loraConfig());
  EXPECT_EQ(models::frozenDigest(*model), summary["lora_base_digest"].get<std::string>());
  auto other = models::createGpt(gptOptions());
  models::loadWeights(*other, ckpt::readStateDict(dir.file("base.pt")), "base.pt");
  models::attachLora(*other, loraConfig());
  EXPECT_NE(models::frozenDigest(*other), summary["lora_base_digest"].get<std::string>());

  auto gen = test::cohort({"generate", dir.file("random"), "--prompt", "the ", "--tokens", "5"});
  ASSERT_EQ(gen.exitCode, 0) << gen.describe();
  EXPECT_NE(gen.err.find(kept + " + " + dir.file("random/model/adapters.pt")), std::string::npos) << gen.err;
  // A checkpoint directory as MODEL (export, serve, score) takes the same
  // frozen weights, checked against its manifest.
  const serve::TrainedModel fromCheckpoint = serve::loadTrainedModel(dir.file("random/checkpoints/step-6"));
  EXPECT_EQ(models::frozenDigest(*fromCheckpoint.model), summary["lora_base_digest"].get<std::string>());
  EXPECT_EQ(fromCheckpoint.info.weights, kept + " + " + dir.file("random/checkpoints/step-6"));

  // The run directory used again by a fresh run (no checkpoint to resume)
  // of another seed: base.pt is that run's.
  auto again = run("random", {"--set", "model.init_from=", "--set", "training.max_steps=6", "--set",
                              "training.seed=6", "--set", "checkpoint.enabled=false"});
  ASSERT_EQ(again.exitCode, 0) << again.describe();
  const auto summary2 = nlohmann::json::parse(test::readText(dir.file("random/summary.json")));
  EXPECT_NE(summary2["lora_base_digest"], summary["lora_base_digest"]);
  auto reloaded = models::createGpt(gptOptions());
  models::loadWeights(*reloaded, ckpt::readStateDict(kept), kept);
  models::attachLora(*reloaded, loraConfig());
  EXPECT_EQ(models::frozenDigest(*reloaded), summary2["lora_base_digest"].get<std::string>());

  // Other frozen weights under the adapters are refused (also under a
  // checkpoint's), as is none.
  fs::copy_file(dir.file("base.pt"), kept, fs::copy_options::overwrite_existing);
  auto swapped = test::cohort({"generate", dir.file("random"), "--tokens", "5"});
  EXPECT_NE(swapped.exitCode, 0) << swapped.describe();
  EXPECT_NE(swapped.err.find("trained beside other frozen weights than " + kept), std::string::npos)
      << swapped.err;
  EXPECT_THROW(serve::loadTrainedModel(dir.file("random/checkpoints/step-6")), DataError);
  fs::remove(kept);
  auto missing = test::cohort({"generate", dir.file("random"), "--tokens", "5"});
  EXPECT_NE(missing.exitCode, 0) << missing.describe();
  EXPECT_NE(missing.err.find("model.lora without model.init_from, and no " + kept), std::string::npos)
      << missing.err;
}

// At ZeRO stage 3 the base is built, loaded and held in parts beside the
// adapters (docs/zero.md): the same training as at stage 0, the same
// digest of the frozen weights, the merged final.pt and base.pt written
// one unit at a time; a killed rank resumes to bitwise the same adapters,
// and a stage-0 checkpoint goes on at stage 3.
TEST_F(LoraJob, AtStageThreeTheBaseIsHeldInPartsAndTrainsAsAtStageZero) {
  // Three blocks: units gathered ahead, and released behind, in both passes.
  writeBase(13, 3, "base3.pt");
  const std::vector<std::string> deep{"--set", "model.n_layer=3", "--set", "model.init_from=" + dir.file("base3.pt")};
  std::vector<std::string> common{"--set", "training.max_steps=12", "--set", "output.merge_lora=true"};
  common.insert(common.end(), deep.begin(), deep.end());
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> all = common;
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  auto zero0 = run("zero0", common);
  ASSERT_EQ(zero0.exitCode, 0) << zero0.describe();
  auto zero3 = run("zero3", with({"--set", "distribution.zero=3"}));
  ASSERT_EQ(zero3.exitCode, 0) << zero3.describe();
  EXPECT_NE(zero3.err.find("(frozen, one unit at a time)"), std::string::npos) << zero3.err;
  EXPECT_NE(zero3.err.find("(adapters merged, one unit at a time)"), std::string::npos) << zero3.err;
  // Over Gloo (no shared memory) the same.
  auto gloo = run("gloo", with({"--set", "distribution.zero=3", "--set", "distribution.shared_memory=false"}));
  ASSERT_EQ(gloo.exitCode, 0) << gloo.describe();
  EXPECT_LT(test::maxDifference(ckpt::readStateDict(dir.file("zero3/model/final.pt")),
                                ckpt::readStateDict(dir.file("gloo/model/final.pt"))),
            1e-4);

  const auto s0 = nlohmann::json::parse(test::readText(dir.file("zero0/summary.json")));
  const auto s3 = nlohmann::json::parse(test::readText(dir.file("zero3/summary.json")));
  // The digest taken as the parts were gathered is the whole base's.
  EXPECT_EQ(s3["lora_base_digest"], s0["lora_base_digest"]);
  // Each of the 2 ranks holds half of the frozen base (and padding).
  const double frozen = s3["parameters"].get<double>() - s3["trainable_parameters"].get<double>();
  ASSERT_TRUE(s3["memory"].contains("frozen_mb")) << s3.dump(2);
  EXPECT_NEAR(s3["memory"]["frozen_mb"].get<double>(), frozen * 4 / 2 / (1 << 20), 0.01) << s3.dump(2);

  // The same training: the adapters and the merged model agree to float
  // sums taken in another order.
  EXPECT_LT(test::maxDifference(ckpt::readStateDict(dir.file("zero0/model/adapters.pt")),
                                ckpt::readStateDict(dir.file("zero3/model/adapters.pt"))),
            1e-4);
  const ckpt::StateDict merged0 = ckpt::readStateDict(dir.file("zero0/model/final.pt"));
  const ckpt::StateDict merged3 = ckpt::readStateDict(dir.file("zero3/model/final.pt"));
  ASSERT_EQ(merged3.size(), merged0.size());
  for (size_t k = 0; k < merged0.size(); ++k) EXPECT_EQ(merged3[k].first, merged0[k].first);
  EXPECT_LT(test::maxDifference(merged0, merged3), 1e-4);

  // A rank killed at stage 3 resumes to bitwise the same adapters.
  auto killed = run("killed", with({"--set", "distribution.zero=3"}), {{"COHORT_FAULT", "kill@rank1:step7"}});
  ASSERT_EQ(killed.exitCode, 0) << killed.describe();
  EXPECT_EQ(nlohmann::json::parse(test::readText(dir.file("killed/summary.json")))["restart_count"], 1);
  EXPECT_EQ(test::maxDifference(ckpt::readStateDict(dir.file("zero3/model/adapters.pt")),
                                ckpt::readStateDict(dir.file("killed/model/adapters.pt"))),
            0.0);

  // A stage-0 checkpoint goes on at stage 3 (its digest is the same).
  auto on = run("on", with({"--set", "training.max_steps=15", "--set", "distribution.zero=3", "--resume",
                            dir.file("zero0/checkpoints/step-12")}));
  EXPECT_EQ(on.exitCode, 0) << on.describe();

  // Without model.init_from the random base is made unit by unit from the
  // same draws, and written one unit at a time: base.pt is stage 0's.
  auto random0 = run("random0", {"--set", "model.n_layer=3", "--set", "model.init_from=", "--set",
                                 "training.max_steps=3"});
  ASSERT_EQ(random0.exitCode, 0) << random0.describe();
  auto random3 = run("random3", {"--set", "model.n_layer=3", "--set", "model.init_from=", "--set",
                                 "training.max_steps=3", "--set", "distribution.zero=3"});
  ASSERT_EQ(random3.exitCode, 0) << random3.describe();
  EXPECT_EQ(test::maxDifference(ckpt::readStateDict(dir.file("random0/model/base.pt")),
                                ckpt::readStateDict(dir.file("random3/model/base.pt"))),
            0.0);
  EXPECT_EQ(nlohmann::json::parse(test::readText(dir.file("random3/summary.json")))["lora_base_digest"],
            nlohmann::json::parse(test::readText(dir.file("random0/summary.json")))["lora_base_digest"]);

  // Resuming at stage 3 over other frozen weights is refused, as at stage 0.
  writeBase(14, 3, "base3.pt");
  auto other = run("other3", with({"--set", "training.max_steps=15", "--set", "distribution.zero=3", "--resume",
                                   dir.file("zero3/checkpoints/step-12")}));
  EXPECT_EQ(other.exitCode, 2) << other.describe();
  EXPECT_NE(other.err.find("its LoRA adapters were trained on other frozen weights"), std::string::npos)
      << other.err;

  // A base of other shapes: exit 2 naming the file and the tensor, at start.
  auto bad = run("bad", {"--set", "distribution.zero=3", "--set", "model.n_layer=2"});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_NE(bad.err.find(dir.file("base.pt") + ": 'transformer."), std::string::npos) << bad.err;
}

TEST_F(LoraJob, MistakesExit2NamingTheKey) {
  auto expectBad = [&](std::vector<std::string> args, const std::string& message) {
    auto r = test::cohort(args);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  };
  expectBad({"run", job(), "--run-dir", dir.file("r1"), "--set", "model.lora.targets=[q_proj]"},
            "model.lora.targets: 'q_proj' matches no layer LoRA can adapt");
  expectBad({"validate", job(), "--set", "model.lora.targets=[]"}, "model.lora.targets: names no layer");
  expectBad({"validate", job(), "--set", "model.lora.rank=0", "--set", "output.merge_lora=true"},
            "output.merge_lora: needs LoRA adapters");
  expectBad({"validate", job(), "--set", "model.lora.alpha=0"}, "model.lora.alpha: must be > 0");
  const std::string tiny = dir.file("tiny.yaml");
  test::writeText(tiny, test::tinyJobYaml("tiny"));
  expectBad({"validate", tiny, "--set", "model.lora.rank=8"},
            "model.lora.rank: LoRA adapts the gpt and llama models' layers, not simple_cnn");
}

}  // namespace
}  // namespace cohort
