// model.arch: torchscript with real processes: modules scripted in Python
// at test time (tests/train/scripted_models.py) train data-parallel on 2
// ranks like a built-in model — buffers and train/eval mode included —
// resume exactly after a rank is killed, save a model/final.pt that loads
// back into the Python module, learn text as language models, and modules
// cohort cannot train exit 2 naming the file.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cohort/ckpt/state_dict.h"
#include "cohort/models/model.h"
#include "test_paths.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/runs.h"

namespace cohort {
namespace {

class ScriptedJob : public ::testing::Test {
 protected:
  test::TempDir dir;

  // Scripts each of `kinds` to <dir>/<kind>.pt (and its initial state dict
  // to <kind>.pt.init.pt) in one Python process; returns the first's path.
  std::string script(const std::vector<std::string>& kinds) {
    std::vector<std::string> args{COHORT_PYTHON, test::sourceDir() + "/tests/train/scripted_models.py", "make",
                                  dir.path()};
    args.insert(args.end(), kinds.begin(), kinds.end());
    auto r = test::run(args);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return dir.file(kinds.front() + ".pt");
  }

  // The tiny synthetic-image job with the scripted module, 3 epochs of 6
  // steps on 2 ranks, a checkpoint every 3 steps.
  std::vector<std::string> cnnJob(const std::string& module) {
    return {"model.arch=torchscript", "model.path=" + module, "training.epochs=3",
            "checkpoint.every_steps=3", "checkpoint.when_behind=wait", "distribution.max_restarts=2"};
  }
};

TEST_F(ScriptedJob, ACnnScriptedInPythonTrainsOnTwoRanksAndLoadsBackIntoIt) {
  const std::string module = script({"cnn"});
  const ckpt::StateDict initial = ckpt::readStateDict(module + ".init.pt");
  const ckpt::StateDict trained = test::trainTiny(dir, "run", 2, cnnJob(module));
  ASSERT_EQ(trained.size(), initial.size());
  std::map<std::string, at::Tensor> init(initial.begin(), initial.end());
  for (const auto& [name, t] : trained) {
    ASSERT_TRUE(init.count(name)) << "final.pt has the module's own names; unexpected " << name;
    if (name == "bn.num_batches_tracked") {
      // Counted by the scripted BatchNorm in training mode: one per
      // micro-batch (3 epochs of 6), none in the start-up probe (eval mode).
      EXPECT_EQ(t.item<int64_t>(), 18);
    } else {
      EXPECT_FALSE(torch::equal(t, init[name])) << name << " did not change";
    }
  }
  const auto summary = nlohmann::json::parse(test::readText(dir.file("run/summary.json")));
  EXPECT_EQ(summary["parameters"].get<int64_t>(), (8 * 9 + 8) + 2 * 8 + (128 * 4 + 4));
  EXPECT_EQ(summary["steps"].get<int64_t>(), 18);

  // cohort's forward with the trained weights is the Python module's.
  ModelConfig mc;
  mc.arch = ModelArch::torchscript;
  mc.path = module;
  auto model = models::createModel(mc, {});
  models::loadWeights(*model, trained, "final.pt");
  model->eval();
  const at::Tensor inputs = torch::randn({5, 1, 8, 8});
  at::Tensor logits;
  {
    torch::NoGradGuard g;
    logits = model->forward(inputs);
  }
  ckpt::saveStateDict({{"inputs", inputs}, {"logits", logits}}, dir.file("io.pt"));
  auto check = test::run({COHORT_PYTHON, test::sourceDir() + "/tests/train/scripted_models.py", "check",
                          "cnn", dir.file("run/model/final.pt"), dir.file("io.pt")});
  EXPECT_EQ(check.exitCode, 0) << check.describe();
}

TEST_F(ScriptedJob, AKilledRankResumesFromItsCheckpointToTheSameWeights) {
  const std::string module = script({"cnn"});
  const ckpt::StateDict reference = test::trainTiny(dir, "reference", 2, cnnJob(module));
  const ckpt::StateDict recovered =
      test::trainTiny(dir, "killed", 2, cnnJob(module), {{"COHORT_FAULT", "kill@rank1:step7"}});
  const auto summary = nlohmann::json::parse(test::readText(dir.file("killed/summary.json")));
  EXPECT_EQ(summary["restart_count"], 1) << summary.dump(2);
  ASSERT_TRUE(summary.contains("resumed_from")) << summary.dump(2);
  // Dropout in the scripted module draws from the restored generator.
  EXPECT_EQ(test::maxDifference(reference, recovered), 0.0);
}

TEST_F(ScriptedJob, AScriptedTokenModelLearnsTextAndGenerates) {
  const std::string module = script({"bigram"});
  const std::string text = test::corpus(40'000);
  test::writeText(dir.file("corpus.txt"), text);
  ASSERT_EQ(test::cohort({"data", "tokenize", dir.file("corpus.txt"), dir.file("tok"), "--no-progress"})
                .exitCode,
            0);
  const std::string job = dir.file("bigram.yaml");
  test::writeText(job, R"(name: bigram
model: {arch: torchscript, path: )" + module + R"(, block_size: 32}
data:
  train: {kind: tokens, path: )" + dir.file("tok/train") + R"(}
  eval: {kind: tokens, path: )" + dir.file("tok/val") + R"(}
distribution: {procs_per_node: 2}
training: {epochs: 3, max_steps: 150, batch_size: 16, optimizer: {name: adamw, lr: 0.01}}
output: {progress: off}
checkpoint: {enabled: false}
)");
  auto r = test::cohort({"run", job, "--run-dir", dir.file("run")});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto summary = nlohmann::json::parse(test::readText(dir.file("run/summary.json")));
  const double baseline = test::unigramLoss(text.substr(0, 36'000), text.substr(36'000));
  const double loss = summary["eval"]["loss"].get<double>();
  RecordProperty("validation_loss", std::to_string(loss));
  RecordProperty("unigram_loss", std::to_string(baseline));
  // Next-byte statistics beat byte frequencies on words.
  EXPECT_LT(loss, 0.8 * baseline);
  EXPECT_GT(summary["train_tokens_per_s"].get<double>(), 0);

  auto gen = test::cohort({"generate", dir.file("run"), "--prompt", "the ", "--tokens", "20", "--temperature", "0"});
  ASSERT_EQ(gen.exitCode, 0) << gen.describe();
  EXPECT_EQ(gen.out.rfind("the ", 0), 0u) << gen.out;
  EXPECT_EQ(gen.out.size(), 4u + 20u + 1u) << gen.out;
}

TEST_F(ScriptedJob, ModulesCohortCannotTrainExit2NamingTheFile) {
  const std::string job = dir.file("tiny.yaml");
  test::writeText(job, test::tinyJobYaml("tiny"));
  int runs = 0;
  auto expectBad = [&](const std::string& verb, const std::string& path, const std::string& message,
                       std::vector<std::string> more = {}) {
    std::vector<std::string> args{verb, job, "--set", "model.arch=torchscript", "--set", "model.path=" + path};
    if (verb == "run") args.insert(args.end(), {"--run-dir", dir.file("run-" + std::to_string(runs++))});
    for (auto& m : more) args.push_back(std::move(m));
    auto r = test::cohort(args);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  };
  test::writeText(dir.file("notes.txt"), "not a module\n");
  expectBad("run", dir.file("notes.txt"), "model.path: " + dir.file("notes.txt") + ": not a TorchScript module");
  const std::string cnn = script({"cnn", "two_inputs", "returns_tuple", "wrong_classes"});
  expectBad("run", cnn + ".init.pt", "model.path: " + cnn + ".init.pt: not a TorchScript module");
  expectBad("run", dir.file("two_inputs.pt"),
            "forward must take the batch's input Tensor and return a Tensor of logits");
  expectBad("run", dir.file("returns_tuple.pt"),
            "forward must take the batch's input Tensor and return a Tensor of logits");
  expectBad("run", dir.file("wrong_classes.pt"),
            "forward maps images [1, 1, 8, 8] to Float of shape [1, 3], but the job needs logits [1, 4]");
  expectBad("validate", dir.file("missing.pt"), "model.path: file not found: " + dir.file("missing.pt"));
  auto noPath = test::cohort({"validate", job, "--set", "model.arch=torchscript"});
  EXPECT_EQ(noPath.exitCode, 2);
  EXPECT_NE(noPath.err.find("model.path: model.arch torchscript needs the module's file"), std::string::npos)
      << noPath.err;
  expectBad("validate", cnn, "model.recompute: blocks is for the gpt and ResNet models; torchscript has no",
            {"--set", "model.recompute=blocks"});
  expectBad("validate", cnn, "model.lora.rank: LoRA adapts the gpt and llama models' layers, not torchscript",
            {"--set", "model.lora.rank=4"});
}

}  // namespace
}  // namespace cohort
