// A language model as its users handle it, end to end with real processes:
// text tokenized by a SentencePiece model trained on Debian's King James
// Bible, a GPT trained on it with GPT-2's activation, the validation loss
// per byte, the weights written as safetensors, generation decoded with the
// dataset's tokenizer (stop strings too), the exports (safetensors, Hugging
// Face's layout, TorchScript carrying the tokenizer), a checkpoint
// consolidated to safetensors, and a job started from the Hugging Face
// export.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cohort/ckpt/safetensors.h"
#include "cohort/data/dataset_manifest.h"
#include "cohort/serve/model.h"
#include "test_paths.h"
#include "util/jobs.h"
#include "util/process.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class LmFormats : public ::testing::Test {
 protected:
  test::TempDir dir;

  std::string job() {
    const std::string path = dir.file("lm.yaml");
    test::writeText(path, R"(name: lm
model: {arch: gpt, n_layer: 1, n_head: 2, n_embd: 48, block_size: 32, activation: gelu_tanh}
data:
  train: {kind: tokens, path: )" + dir.file("tok/train") + R"(}
  eval: {kind: tokens, path: )" + dir.file("tok/val") + R"(, limit: 40}
distribution: {procs_per_node: 2}
training:
  max_steps: 30
  batch_size: 8
  optimizer: {name: adamw, lr: 0.003}
output: {progress: off, weights_format: safetensors}
checkpoint: {every_steps: 15, when_behind: wait}
)");
    return path;
  }
};

TEST_F(LmFormats, SentencePieceTokensSafetensorsWeightsAndTheExportsAUserNeeds) {
  const auto bible = test::run({"/usr/bin/bible", "-l80", "Gen1:1-Gen50:26"});
  ASSERT_EQ(bible.exitCode, 0) << bible.describe();
  test::writeText(dir.file("genesis.txt"), bible.out);
  auto tok = test::cohort({"data", "tokenize", dir.file("genesis.txt"), dir.file("tok"), "--tokenizer",
                           "sentencepiece", "--vocab-size", "1000", "--no-progress"});
  ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  EXPECT_NE(tok.out.find("tokenizer sentencepiece, vocabulary 1000"), std::string::npos) << tok.out;

  const std::string run = dir.file("run");
  auto r = test::cohort({"run", job(), "--run-dir", run});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  // The weights as safetensors, and only so.
  EXPECT_TRUE(ckpt::isSafetensors(run + "/model/final.safetensors"));
  EXPECT_FALSE(fs::exists(run + "/model/final.pt"));
  const json summary = json::parse(test::readText(run + "/summary.json"));
  EXPECT_EQ(summary["outputs"]["model"].get<std::string>(), run + "/model/final.safetensors");
  // The loss per byte: per token over the held-out text's bytes per token.
  const data::DatasetManifest val =
      data::parseDatasetManifest(test::readText(dir.file("tok/val/dataset.json")), "val");
  const double bytesPerToken = double(val.textBytes) / double(val.records());
  EXPECT_GT(bytesPerToken, 2.0);
  const double loss = summary["eval"]["loss"].get<double>();
  EXPECT_NEAR(summary["eval"]["loss_per_byte"].get<double>(), loss / bytesPerToken, 1e-9);
  EXPECT_NEAR(summary["eval"]["bits_per_byte"].get<double>(), loss / bytesPerToken / std::log(2.0), 1e-9);

  // Generation decodes with the dataset's tokenizer; a stop string ends it.
  auto gen = [&](const std::vector<std::string>& more) {
    std::vector<std::string> args{"generate", run, "--prompt", "And God said", "--tokens", "60", "--temperature", "0"};
    args.insert(args.end(), more.begin(), more.end());
    return test::cohort(args);
  };
  auto g = gen({});
  ASSERT_EQ(g.exitCode, 0) << g.describe();
  ASSERT_EQ(g.out.rfind("And God said", 0), 0u) << g.out;
  EXPECT_GT(g.out.size(), 12u + 60u) << "60 pieces of several bytes";
  EXPECT_EQ(gen({"--no-kv-cache"}).out, g.out);
  const std::string completion = g.out.substr(12);
  const std::string stop = completion.substr(completion.size() / 2, 2);
  EXPECT_EQ(gen({"--stop", stop}).out, "And God said" + completion.substr(0, completion.find(stop)) + "\n");

  // safetensors of cohort's names; Hugging Face's GPT-2 layout.
  auto ex = test::cohort({"export", run, "--format", "safetensors"});
  ASSERT_EQ(ex.exitCode, 0) << ex.describe();
  ckpt::SafetensorsFile st(run + "/model/model.safetensors");
  EXPECT_EQ(st.entries().size(), 2u + 12u + 2u);  // wte, wpe; a block's 12; ln_f
  EXPECT_EQ(st.metadata().at("tied"), "lm_head.weight=transformer.wte.weight");
  ex = test::cohort({"export", run, "--format", "huggingface"});
  ASSERT_EQ(ex.exitCode, 0) << ex.describe();
  const json config = json::parse(test::readText(run + "/model/hf/config.json"));
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["vocab_size"], 1000);
  ckpt::SafetensorsFile hf(run + "/model/hf/model.safetensors");
  EXPECT_EQ(hf.load("transformer.h.0.attn.c_attn.weight").sizes(), (std::vector<int64_t>{48, 144}));

  // TorchScript carries the tokenizer: a served export decodes without the
  // dataset.
  ex = test::cohort({"export", run, "--format", "torchscript"});
  ASSERT_EQ(ex.exitCode, 0) << ex.describe();
  fs::rename(dir.file("tok"), dir.file("tok-moved"));
  const auto predictor = serve::openPredictor(run + "/model/model.ts.pt");
  ASSERT_TRUE(predictor->info().text != nullptr);
  EXPECT_EQ(predictor->info().text->vocabSize(), 1000);
  EXPECT_EQ(serve::textTokenizer(predictor->info()).decode(serve::textTokenizer(predictor->info()).encode("In the beginning")),
            "In the beginning");
  fs::rename(dir.file("tok-moved"), dir.file("tok"));

  // A checkpoint consolidated to safetensors holds the trained tensors
  // (when_behind: wait above: on a busy machine the writer can still be on
  // step 15 at step 30, which would otherwise skip the last checkpoint).
  auto c = test::cohort({"ckpt", "consolidate", run + "/checkpoints", dir.file("consolidated.safetensors")});
  ASSERT_EQ(c.exitCode, 0) << c.describe();
  EXPECT_NE(c.out.find("safetensors"), std::string::npos) << c.out;
  ckpt::SafetensorsFile consolidated(dir.file("consolidated.safetensors"));
  ckpt::SafetensorsFile final(run + "/model/final.safetensors");
  EXPECT_TRUE(torch::equal(consolidated.load("transformer.h.0.mlp.c_fc.weight"),
                           final.load("transformer.h.0.mlp.c_fc.weight")));

  // A job starts from the Hugging Face export: the first evaluation is the
  // trained model's, not a random one's.
  const std::string again = dir.file("again");
  r = test::cohort({"run", job(), "--run-dir", again, "--set", "model.init_from=" + run + "/model/hf", "--set",
                    "training.max_steps=1", "--set", "training.optimizer.lr=1e-9"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const double resumed = json::parse(test::readText(again + "/summary.json"))["eval"]["loss"].get<double>();
  EXPECT_NEAR(resumed, loss, 1e-3 * loss);
  // The export's config.json says gelu_new: a job with the exact GELU is refused.
  r = test::cohort({"run", job(), "--run-dir", dir.file("bad"), "--set", "model.init_from=" + run + "/model/hf",
                    "--set", "model.activation=gelu"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("set model.activation: gelu_tanh"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cohort
