// A Llama-family job end to end with real processes: 2 ranks train a small
// llama with grouped-query attention below the unigram loss and generate
// with and without the key/value cache; the trained model goes out in
// Hugging Face's layout and comes back in, whole and sharded
// (model.safetensors.index.json), into serving, a ZeRO-3 run that
// reads it one unit at a time, and LoRA; ZeRO 3, a pipeline, recompute
// and bf16 train it; bad Hugging Face files exit 2 naming the file and
// the field.

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

#include "cohort/ckpt/safetensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/weights.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

class LlamaJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    text_ = test::corpus(60'000);
    test::writeText(dir_->file("corpus.txt"), text_);
    auto tok = test::cohort({"data", "tokenize", dir_->file("corpus.txt"), dir_->file("tok"), "--no-progress"});
    ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // A llama of 2 blocks, 4 query heads reading 2 key/value heads, an
  // untied head.
  static std::string yaml(const std::string& name, int steps, const std::string& extra = "") {
    return "name: " + name + R"(
model: {arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 32, intermediate_size: 64, block_size: 32}
data:
  train: {kind: tokens, path: )" +
           dir_->file("tok/train") + R"(}
  eval: {kind: tokens, path: )" +
           dir_->file("tok/val") + R"(}
  loader_threads: 1
distribution: {procs_per_node: 2, threads_per_rank: 1, timeout_s: 60}
training:
  epochs: 6
  max_steps: )" + std::to_string(steps) +
           R"(
  batch_size: 16
  seed: 3
  optimizer: {name: adamw, lr: 0.006}
  log_every: 50
output: {progress: off}
checkpoint: {enabled: false}
)" + extra;
  }

  static test::ProcessResult generate(const std::vector<std::string>& args) {
    std::vector<std::string> all{"generate"};
    all.insert(all.end(), args.begin(), args.end());
    for (const char* a : {"--prompt", "the lord ", "--tokens", "30", "--temperature", "0"}) all.push_back(a);
    return test::cohort(all);
  }

  static test::TempDir* dir_;
  static std::string text_;
};

test::TempDir* LlamaJob::dir_ = nullptr;
std::string LlamaJob::text_;

// Every tensor of the weights file at `path`.
ckpt::StateDict readAll(const std::string& path) {
  auto source = ckpt::openWeights(path);
  ckpt::StateDict out;
  for (const auto& [name, t] : source->entries()) out.emplace_back(name, source->load(name).clone());
  return out;
}

// Splits dir/model.safetensors into two shards and an index beside them
// in `to`, with config.json.
void shard(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  fs::copy_file(from + "/config.json", to + "/config.json");
  const ckpt::StateDict all = readAll(from + "/model.safetensors");
  nlohmann::json map = nlohmann::json::object();
  ckpt::StateDict parts[2];
  for (size_t i = 0; i < all.size(); ++i) {
    const int k = i < all.size() / 2 ? 0 : 1;
    parts[k].push_back(all[i]);
    map[all[i].first] = fmt::format("model-0000{}-of-00002.safetensors", k + 1);
  }
  for (int k = 0; k < 2; ++k) {
    ckpt::saveSafetensors(parts[k], fmt::format("{}/model-0000{}-of-00002.safetensors", to, k + 1));
  }
  test::writeText(to + "/model.safetensors.index.json",
                  nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(2));
}

TEST_F(LlamaJob, TrainsGeneratesAndGoesOutAndBackInHuggingFacesLayout) {
  const std::string run = dir_->file("run");
  auto r = test::runJob(*dir_, "run", yaml("run", 300), 2, {});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const double baseline = test::unigramLoss(text_.substr(0, 54'000), text_.substr(54'000));
  const auto summary = nlohmann::json::parse(test::readText(run + "/summary.json"));
  const double loss = summary["eval"]["loss"].get<double>();
  EXPECT_LT(loss, 0.8 * baseline) << "validation loss against the unigram baseline";
  RecordProperty("validation_loss", std::to_string(loss));

  // Greedy text with the cache (which holds the 2 key/value heads) and
  // without: the same.
  auto cached = generate({run});
  ASSERT_EQ(cached.exitCode, 0) << cached.describe();
  EXPECT_EQ(cached.out.rfind("the lord ", 0), 0u) << cached.out;
  auto uncached = generate({run, "--no-kv-cache"});
  EXPECT_EQ(uncached.out, cached.out);

  // Out in Hugging Face's layout: config.json and model.safetensors with
  // LlamaForCausalLM's names.
  const std::string hf = dir_->file("hf");
  auto ex = test::cohort({"export", run, "--format", "huggingface", "--out", hf});
  ASSERT_EQ(ex.exitCode, 0) << ex.describe();
  EXPECT_NE(ex.out.find("LlamaForCausalLM"), std::string::npos) << ex.out;
  const auto config = nlohmann::json::parse(test::readText(hf + "/config.json"));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["intermediate_size"], 64);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  const ckpt::StateDict exported = readAll(hf + "/model.safetensors");
  const ckpt::StateDict trained = ckpt::readStateDict(run + "/model/final.pt");
  EXPECT_EQ(test::maxDifference(exported, trained), 0.0);
  ASSERT_TRUE(test::tensorNamed(exported, "model.layers.1.self_attn.k_proj.weight").defined());
  EXPECT_EQ(test::tensorNamed(exported, "model.layers.1.self_attn.k_proj.weight").size(0), 16);

  // Served from the directory: the greedy text is the run's.
  {
    const std::string portFile = dir_->file("port");
    test::Process server({test::cohortBin(), "serve", hf, "--job", run + "/job.yaml", "--port", "0", "--port-file",
                          portFile});
    const int port = test::waitForPortFile(portFile);
    ASSERT_GT(port, 0) << server.stderrSoFar();
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(60, 0);
    const auto reply = client.Post(
        "/v1/generate", nlohmann::json{{"prompt", "the lord "}, {"max_tokens", 30}, {"temperature", 0}}.dump(),
        "application/json");
    ASSERT_TRUE(reply) << httplib::to_string(reply.error());
    ASSERT_EQ(reply->status, 200) << reply->body;
    EXPECT_EQ("the lord " + nlohmann::json::parse(reply->body)["text"].get<std::string>() + "\n", cached.out);
    server.signal(SIGTERM);
    EXPECT_EQ(server.wait(std::chrono::seconds(60)).exitCode, 0);
  }
  // And as safetensors in cohort's names (the same: llama's names are Hugging Face's).
  ASSERT_EQ(test::cohort({"export", run, "--format", "safetensors", "--out", dir_->file("llama.safetensors")}).exitCode,
            0);
  EXPECT_EQ(test::maxDifference(readAll(dir_->file("llama.safetensors")), trained), 0.0);

  // Back in, whole and sharded: a run started from either (at a learning
  // rate that moves nothing visible) ends at the trained weights, and its
  // first evaluation is the trained model's; the ZeRO-3 run reads the shards
  // one unit at a time.
  const std::string sharded = dir_->file("hf-sharded");
  shard(hf, sharded);
  struct From {
    std::string tag, path;
    std::vector<std::string> sets;
  };
  for (const From& f : {From{"from-hf", hf, {}}, From{"from-shards", sharded, {"distribution.zero=3"}}}) {
    std::vector<std::string> sets = f.sets;
    sets.push_back("model.init_from=" + f.path);
    sets.push_back("training.optimizer.lr=1e-12");
    auto z = test::runJob(*dir_, f.tag, yaml(f.tag, 1), 2, sets);
    ASSERT_EQ(z.exitCode, 0) << z.describe();
    if (!f.sets.empty()) {
      EXPECT_NE(z.err.find("one unit at a time"), std::string::npos) << z.err;
    }
    EXPECT_LT(test::maxDifference(ckpt::readStateDict(dir_->file(f.tag + "/model/final.pt")), trained), 1e-8);
    const auto after = nlohmann::json::parse(test::readText(dir_->file(f.tag + "/summary.json")));
    EXPECT_NEAR(after["eval"]["loss"].get<double>(), loss, 1e-4) << f.tag;
  }
  // LoRA on it: the adapters train, the base stays.
  auto lora = test::runJob(*dir_, "lora", yaml("lora", 20), 2,
                           {"model.init_from=" + sharded, "model.lora.rank=4", "model.lora.targets=[attn, mlp]"});
  ASSERT_EQ(lora.exitCode, 0) << lora.describe();
  EXPECT_NE(lora.err.find("on 14 layers"), std::string::npos) << lora.err;
}

// ZeRO 3 and a 2-stage pipeline train the same weights as plain data
// parallelism up to float rounding; recompute bitwise; bf16 trains.
TEST_F(LlamaJob, EveryPlanTrainsTheSameModel) {
  auto train = [&](const std::string& tag, int procs, const std::vector<std::string>& sets) {
    auto r = test::runJob(*dir_, tag, yaml(tag, 12), procs, sets);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return ckpt::readStateDict(dir_->file(tag + "/model/final.pt"));
  };
  const ckpt::StateDict plain = train("plain", 2, {});
  EXPECT_LT(test::maxDifference(plain, train("zero3", 2, {"distribution.zero=3"})), 1e-5);
  EXPECT_EQ(test::maxDifference(plain, train("recompute", 2, {"model.recompute=blocks"})), 0.0);
  // One replica of 2 stages taking the 2 replicas' batches as its 2 micro-batches.
  EXPECT_LT(test::maxDifference(plain, train("pipeline", 2,
                                             {"distribution.pipeline.stages=2", "distribution.pipeline.micro_batches=2"})),
            1e-5);
  auto bf16 = test::runJob(*dir_, "bf16", yaml("bf16", 12), 2, {"training.precision=bf16"});
  EXPECT_EQ(bf16.exitCode, 0) << bf16.describe();
}

TEST_F(LlamaJob, BadHuggingFaceFilesExit2NamingTheFileAndTheField) {
  // A model of the job's sizes in Hugging Face's layout, from cohort's
  // export of an untrained run.
  auto r = test::runJob(*dir_, "zero-steps", yaml("zero-steps", 1), 1, {});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string hf = dir_->file("bad-hf");
  ASSERT_EQ(test::cohort({"export", dir_->file("zero-steps"), "--format", "huggingface", "--out", hf}).exitCode, 0);
  const std::string sharded = dir_->file("bad-sharded");
  shard(hf, sharded);
  auto start = [&](const std::string& tag, const std::string& from, std::vector<std::string> sets = {}) {
    sets.push_back("model.init_from=" + from);
    auto res = test::runJob(*dir_, tag, yaml(tag, 1), 1, sets);
    EXPECT_EQ(res.exitCode, 2) << res.describe();
    EXPECT_FALSE(fs::exists(dir_->file(tag + "/model/final.pt"))) << "nothing written";
    EXPECT_FALSE(fs::exists(dir_->file(tag + "/checkpoints"))) << "nothing written";
    return res.err;
  };
  // An index naming a missing shard.
  fs::remove(sharded + "/model-00002-of-00002.safetensors");
  std::string err = start("missing-shard", sharded);
  EXPECT_NE(err.find("model.safetensors.index.json: weight_map:"), std::string::npos) << err;
  EXPECT_NE(err.find("model-00002-of-00002.safetensors', which is missing"), std::string::npos) << err;
  // A config.json whose sizes disagree with the tensors (and the job
  // agreeing with the config).
  auto config = nlohmann::json::parse(test::readText(hf + "/config.json"));
  config["intermediate_size"] = 96;
  test::writeText(hf + "/config.json", config.dump(2));
  err = start("bad-shapes", hf, {"model.intermediate_size=96"});
  EXPECT_NE(err.find("config.json: intermediate_size give 'model.layers.0.mlp."), std::string::npos) << err;
  EXPECT_NE(err.find("the shape [96, 32]"), std::string::npos) << err;
  // A config.json of other sizes than the job: the key to set.
  err = start("other-sizes", hf);
  EXPECT_NE(err.find("config.json: intermediate_size is 96, the job's model.intermediate_size is 64: set "
                     "model.intermediate_size: 96"),
            std::string::npos)
      << err;
  // Not JSON.
  test::writeText(hf + "/config.json", "{\"model_type\": \"llama\",");
  err = start("not-json", hf);
  EXPECT_NE(err.find("config.json: not JSON"), std::string::npos) << err;
}

}  // namespace
}  // namespace cohort
