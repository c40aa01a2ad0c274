// BERT end to end with real processes: text tokenized with a WordPiece
// vocab.txt, 2 ranks pretraining by masked language modelling well below
// the tokens' unigram loss, out in Hugging Face's BertForMaskedLM layout,
// fine-tuned from that directory into a classifier of labelled texts whose
// accuracy each evaluation reports, served (POST /v1/predict with text),
// out as BertForSequenceClassification; and the labelled texts' mistakes.

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cohort/ckpt/weights.h"
#include "cohort/data/tokenizer.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A WordPiece vocabulary of single letters: a word is its first letter and
// ##-pieces of the rest, so a masked piece is told by its word's others.
std::string letterVocab() {
  std::string v = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n.\n";
  for (char c = 'a'; c <= 'z'; ++c) v += std::string(1, c) + "\n";
  for (char c = 'a'; c <= 'z'; ++c) v += "##" + std::string(1, c) + "\n";
  return v;
}

// Labelled texts: the corpus's sentences, label 1 when "moses" is in them.
std::string labelled(uint64_t seed, int lines) {
  const std::string text = test::corpus(static_cast<size_t>(lines) * 80, seed);
  std::string out;
  size_t at = 0;
  for (int n = 0; n < lines;) {
    const size_t end = text.find('\n', at);
    if (end == std::string::npos) break;
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.size() < 3) continue;
    out += std::string(line.find("moses") != std::string::npos ? "1" : "0") + "\t" + line + "\n";
    ++n;
  }
  return out;
}

class BertJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    test::writeText(dir_->file("vocab.txt"), letterVocab());
    test::writeText(dir_->file("corpus.txt"), test::corpus(60'000));
    auto tok = test::cohort({"data", "tokenize", dir_->file("corpus.txt"), dir_->file("tok"), "--tokenizer",
                             dir_->file("vocab.txt"), "--no-progress"});
    ASSERT_EQ(tok.exitCode, 0) << tok.describe();
    test::writeText(dir_->file("train.tsv"), labelled(7, 1500));
    test::writeText(dir_->file("eval.tsv"), labelled(8, 300));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::string model(const std::string& task) {
    return "model: {arch: bert, task: " + task +
           ", n_layer: 2, n_head: 4, n_embd: 64, intermediate_size: 128, block_size: 48, num_classes: 2}\n";
  }
  static std::string common(int epochs) {
    return "distribution: {procs_per_node: 2, threads_per_rank: 1, timeout_s: 60}\n"
           "training: {epochs: " +
           std::to_string(epochs) +
           ", batch_size: 16, seed: 4, optimizer: {name: adamw, lr: 0.002}, log_every: 50}\n"
           "output: {progress: off}\ncheckpoint: {enabled: false}\n";
  }
  static std::string pretraining(const std::string& name) {
    return "name: " + name + "\n" + model("masked_lm") + "data:\n  train: {kind: tokens, path: " +
           dir_->file("tok/train") + "}\n  eval: {kind: tokens, path: " + dir_->file("tok/val") +
           "}\n  loader_threads: 1\n" + common(50);
  }
  static std::string classifying(const std::string& name, const std::string& train) {
    return "name: " + name + "\n" + model("classify") + "data:\n  train: {kind: text_classes, path: " + train +
           ", tokenizer: " + dir_->file("vocab.txt") + "}\n  eval: {kind: text_classes, path: " +
           dir_->file("eval.tsv") + ", tokenizer: " + dir_->file("vocab.txt") + "}\n  loader_threads: 1\n" +
           common(6);
  }

  static test::TempDir* dir_;
};

test::TempDir* BertJob::dir_ = nullptr;

// The tokens' cross-entropy under their own frequencies in the training
// text: what a model that knew no context would score.
double unigramTokenLoss(const std::string& vocab, const std::string& fit, const std::string& text) {
  const auto tok = data::loadTokenizerFile(vocab);
  std::map<int64_t, double> count;
  const auto a = tok->encode(fit), b = tok->encode(text);
  for (int64_t id : a) count[id] += 1;
  double sum = 0;
  for (int64_t id : b) sum -= std::log(std::max(count[id], 0.5) / double(a.size()));
  return sum / double(b.size());
}

TEST_F(BertJob, PretrainsFineTunesFromItsHuggingFaceFilesAndServes) {
  // A small post-LayerNorm BERT sits at the tokens' unigram loss for about
  // 1000 steps before it uses the context (measured); 50 epochs are 1400.
  auto pre = test::runJob(*dir_, "pre", pretraining("pre"), 2, {"training.optimizer.lr=0.001", "training.eval_every=10"});
  ASSERT_EQ(pre.exitCode, 0) << pre.describe();
  EXPECT_NE(pre.err.find("masked-token top-1"), std::string::npos) << pre.err;
  const auto summary = json::parse(test::readText(dir_->file("pre/summary.json")));
  const std::string text = test::corpus(60'000);
  const double unigram = unigramTokenLoss(dir_->file("vocab.txt"), text.substr(0, 54'000), text.substr(54'000));
  const double loss = summary["eval"]["loss"].get<double>();
  RecordProperty("masked_lm_loss", std::to_string(loss));
  EXPECT_LT(loss, 0.5 * unigram) << "a masked letter is told by its word";
  EXPECT_FALSE(summary["eval"].contains("loss_per_byte")) << "not a code length of the text";

  // Out as BertForMaskedLM: the encoder and the head, the tied decoder left out.
  const std::string hf = dir_->file("hf-mlm");
  auto ex = test::cohort({"export", dir_->file("pre"), "--format", "huggingface", "--out", hf});
  ASSERT_EQ(ex.exitCode, 0) << ex.describe();
  EXPECT_NE(ex.out.find("BertForMaskedLM"), std::string::npos) << ex.out;
  const json config = json::parse(test::readText(hf + "/config.json"));
  EXPECT_EQ(config["model_type"], "bert");
  EXPECT_EQ(config["intermediate_size"], 128);
  EXPECT_EQ(config["pad_token_id"], 0);
  const auto file = ckpt::openWeights(hf + "/model.safetensors");
  std::map<std::string, at::Tensor> exported;
  for (const auto& [name, t] : file->entries()) exported.emplace(name, file->load(name));
  EXPECT_EQ(exported.count("cls.predictions.transform.LayerNorm.weight"), 1u);
  EXPECT_EQ(exported.count("cls.predictions.decoder.weight"), 0u);
  // With the training data's tokenizer, which tokenizes again from the directory.
  ASSERT_TRUE(fs::exists(hf + "/tokenizer.json"));
  auto again = test::cohort({"data", "tokenize", dir_->file("corpus.txt"), dir_->file("tok-again"), "--tokenizer", hf,
                             "--no-progress"});
  ASSERT_EQ(again.exitCode, 0) << again.describe();
  EXPECT_EQ(test::readText(dir_->file("tok-again/train/tokens-00000.bin")), test::readText(dir_->file("tok/train/tokens-00000.bin")));

  // Fine-tuned from that directory: the encoder starts pretrained, the
  // pooler and classifier new; each evaluation reports the accuracy.
  auto fine = test::runJob(*dir_, "fine", classifying("fine", dir_->file("train.tsv")), 2,
                           {"model.init_from=" + hf});
  ASSERT_EQ(fine.exitCode, 0) << fine.describe();
  int evals = 0;
  for (const auto& line : test::readJsonLines(dir_->file("fine/metrics.jsonl"))) {
    if (line.value("event", "") == "eval") {
      ++evals;
      EXPECT_TRUE(line.contains("top1")) << line.dump();
    }
  }
  EXPECT_EQ(evals, 6);
  const double accuracy = json::parse(test::readText(dir_->file("fine/summary.json")))["eval"]["top1"].get<double>();
  RecordProperty("accuracy", std::to_string(accuracy));
  EXPECT_GT(accuracy, 0.9) << "whether a text names moses";
  const ckpt::StateDict tuned = ckpt::readStateDict(dir_->file("fine/model/final.pt"));
  EXPECT_TRUE(test::tensorNamed(tuned, "classifier.weight").defined());

  // Out as BertForSequenceClassification.
  auto ex2 = test::cohort({"export", dir_->file("fine"), "--format", "huggingface", "--out", dir_->file("hf-cls")});
  ASSERT_EQ(ex2.exitCode, 0) << ex2.describe();
  EXPECT_EQ(json::parse(test::readText(dir_->file("hf-cls/config.json")))["architectures"][0],
            "BertForSequenceClassification");

  // Served: texts in, classes out.
  const std::string portFile = dir_->file("port");
  test::Process server({test::cohortBin(), "serve", dir_->file("fine"), "--port", "0", "--port-file", portFile});
  const int port = test::waitForPortFile(portFile);
  ASSERT_GT(port, 0) << server.stderrSoFar();
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  auto r = client.Post("/v1/predict",
                       json{{"texts", {"and moses went out of egypt", "the people went out of the land"}}}.dump(),
                       "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  ASSERT_EQ(r->status, 200) << r->body;
  const json answer = json::parse(r->body);
  EXPECT_EQ(answer["predictions"][0]["top_k"][0]["label"], 1) << r->body;
  EXPECT_EQ(answer["predictions"][1]["top_k"][0]["label"], 0) << r->body;
  auto bad = client.Post("/v1/predict", R"({"inputs": [[1, 2]]})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait(std::chrono::seconds(60)).exitCode, 0);
}

// ZeRO stages 2 and 3 (the whole model one unit) train the weights plain
// data parallelism does, recompute bitwise; bf16 trains; and the weights go
// out as safetensors under the same names.
TEST_F(BertJob, EveryPlanTrainsTheSameClassifier) {
  auto train = [&](const std::string& tag, const std::vector<std::string>& sets) {
    std::vector<std::string> all = {"training.max_steps=8"};
    all.insert(all.end(), sets.begin(), sets.end());
    auto r = test::runJob(*dir_, tag, classifying(tag, dir_->file("train.tsv")), 2, all);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return ckpt::readStateDict(dir_->file(tag + "/model/final.pt"));
  };
  const ckpt::StateDict plain = train("plain", {});
  EXPECT_LT(test::maxDifference(plain, train("zero2", {"distribution.zero=2"})), 1e-5);
  EXPECT_LT(test::maxDifference(plain, train("zero3", {"distribution.zero=3"})), 1e-5);
  EXPECT_EQ(test::maxDifference(plain, train("again", {"model.recompute=blocks"})), 0.0);
  const ckpt::StateDict low = train("bf16", {"training.precision=bf16"});
  EXPECT_GT(test::maxDifference(plain, low), 0.0) << "bf16 computed something else";
  auto ex = test::cohort({"export", dir_->file("plain"), "--format", "safetensors", "--out", dir_->file("plain.safetensors")});
  ASSERT_EQ(ex.exitCode, 0) << ex.describe();
  const auto file = ckpt::openWeights(dir_->file("plain.safetensors"));
  ckpt::StateDict exported;
  for (const auto& [name, t] : file->entries()) exported.emplace_back(name, file->load(name).clone());
  EXPECT_EQ(test::maxDifference(exported, plain), 0.0);
}

TEST_F(BertJob, LabelledTextMistakesExit2NamingTheFileAndLine) {
  test::writeText(dir_->file("bad.tsv"), "1\tthe lord said\nthe people went out\n");
  auto r = test::runJob(*dir_, "bad", classifying("bad", dir_->file("bad.tsv")), 1, {});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("bad.tsv:2: no label: each line is LABEL<TAB>TEXT"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_->file("bad/model/final.pt")));
  test::writeText(dir_->file("bad.tsv"), "1\tthe lord said\n2\tthe people went out\n");
  r = test::runJob(*dir_, "bad2", classifying("bad2", dir_->file("bad.tsv")), 1, {});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("bad.tsv:2: label '2' is not a class: expected an integer in [0, 2)"), std::string::npos)
      << r.err;
  // A tokenizer without [MASK] cannot pretrain.
  auto tok = test::cohort({"data", "tokenize", dir_->file("corpus.txt"), dir_->file("bytes"), "--no-progress"});
  ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  r = test::runJob(*dir_, "nomask", pretraining("nomask"), 1,
                   {"data.train.path=" + dir_->file("bytes/train"), "data.eval.path=" + dir_->file("bytes/val")});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("has no [MASK]"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cohort
