// `cohort export` (serve/export.h), run as a real process on small trained
// runs of every architecture kind (llama's grouped-query attention, tied
// and untied heads too): the ONNX file passes onnx.checker's full
// check in Python and ONNX Runtime (Node.js) computes cohort's own logits
// from it at two batch sizes; the TorchScript file gives the same logits in
// Python's torch.jit.load and through serve::openPredictor; bad options exit 2.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cohort/serve/model.h"
#include "test_paths.h"
#include "util/deploy.h"
#include "util/jobs.h"
#include "util/python.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

const char* kQuiet = R"(
distribution: {procs_per_node: 1, threads_per_rank: 1, timeout_s: 60}
output: {progress: off}
checkpoint: {enabled: false}
)";

// Trains `yaml` (a job) into dir/<name>/run and returns the run directory.
std::string trainJob(const test::TempDir& dir, const std::string& name, const std::string& yaml) {
  const std::string base = dir.file(name);
  fs::create_directories(base);
  test::writeText(base + "/job.yaml", yaml + kQuiet);
  const test::ProcessResult r = test::cohort({"run", base + "/job.yaml", "--run-dir", base + "/run"});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  return base + "/run";
}

void writeRaw(const std::string& path, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::ofstream(path, std::ios::binary)
      .write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

at::Tensor readFloats(const std::string& path, const std::vector<int64_t>& dims) {
  at::Tensor t = torch::empty(dims, torch::kFloat);
  std::ifstream in(path, std::ios::binary);
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(t.nbytes())) << path;
  return t;
}

std::string dimsText(const at::Tensor& t) {
  std::string s;
  for (int64_t d = 0; d < t.dim(); ++d) s += (d > 0 ? "," : "") + std::to_string(t.size(d));
  return s;
}

// Raw pixels 0..255, or token ids below the vocabulary, for `info`.
at::Tensor inputFor(const serve::ModelInfo& info, int64_t batch, int64_t time, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (info.tokens) return torch::randint(0, info.tokenizerVocab, {batch, time}, gen, torch::kLong);
  return torch::rand({batch, info.channels, info.height, info.width}, gen) * 255.0;
}

// `actual` within 1e-4 of `expected` (relative to its magnitude past 1).
::testing::AssertionResult closeTo(const at::Tensor& expected, const at::Tensor& actual) {
  if (expected.sizes() != actual.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << ", expected " << expected.sizes();
  }
  if (!torch::isfinite(expected).all().item<bool>()) {
    return ::testing::AssertionFailure() << "cohort's logits are not finite";
  }
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  const double diff = (expected - actual).abs().max().item<double>();
  if (diff <= 1e-4 * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |difference| " << diff << " > " << 1e-4 * scale;
}

class ExportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    runs_ = new std::map<std::string, std::string>;
    auto& runs = *runs_;
    runs["cnn"] = test::trainDeployRun(*dir_, test::DeployModel::cnn);
    runs["resnet18"] = test::trainDeployRun(*dir_, test::DeployModel::resnet);
    runs["gpt"] = test::trainDeployRun(*dir_, test::DeployModel::gpt);
    runs["cnn_plain"] = trainJob(*dir_, "cnn_plain", R"(name: cnn_plain
model: {arch: simple_cnn, num_classes: 3, width: 4, hidden: 8, batch_norm: false}
data:
  train: {kind: synthetic, size: 16, shape: [3, 12, 12], seed: 4, mean: [0.4, 0.5, 0.6], std: [0.2, 0.3, 0.25]}
training: {epochs: 1, max_steps: 2, batch_size: 8, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
)");
    runs["resnet50"] = trainJob(*dir_, "resnet50", R"(name: resnet50
model: {arch: resnet50, num_classes: 3, zero_init_residual: true}
data:
  train: {kind: synthetic, size: 4, shape: [3, 32, 32], seed: 6, mean: [0.5, 0.4, 0.3], std: [0.25, 0.2, 0.3]}
training: {epochs: 1, max_steps: 2, batch_size: 2, optimizer: {name: sgd, lr: 0.01, momentum: 0.9}}
)");
    runs["resnet101"] = trainJob(*dir_, "resnet101", R"(name: resnet101
model: {arch: resnet101, num_classes: 2, small_input: true, zero_init_residual: true}
data:
  train: {kind: synthetic, size: 4, shape: [3, 16, 16], seed: 7, mean: [0.5, 0.5, 0.5], std: [0.3, 0.3, 0.3]}
training: {epochs: 1, max_steps: 1, batch_size: 4, optimizer: {name: sgd, lr: 0.01, momentum: 0.9}}
)");
    // The GPT's other layout, without biases; then LoRA adapters on it,
    // which the export merges (a LoRA run's frozen base is its init_from).
    const std::string tokens = runs["gpt"] + "/../tok/train";
    auto gptJob = [&](const std::string& name, const std::string& extraModel) {
      return "name: " + name + R"(
model:
  arch: gpt
  n_layer: 2
  n_head: 2
  n_embd: 16
  block_size: 12
  bias: false
)" + extraModel +
             R"(
data:
  train: {kind: tokens, path: )" +
             tokens + R"(}
training: {epochs: 1, max_steps: 6, batch_size: 8, optimizer: {name: adamw, lr: 0.02}}
)";
    };
    runs["gpt_nobias"] = trainJob(*dir_, "gpt_nobias", gptJob("gpt_nobias", ""));
    runs["gpt_lora"] = trainJob(*dir_, "gpt_lora",
                                gptJob("gpt_lora", "  init_from: " + runs["gpt_nobias"] +
                                                       "/model/final.pt\n"
                                                       "  lora: {rank: 2, alpha: 8, targets: [attn, mlp]}"));
    // Llama: 4 query heads on 2 key/value heads, untied (DeployModel::llama);
    // tied on 1 key/value head with linearly scaled rotary angles; and LoRA
    // adapters on an untied one, merged by the export. 40 steps: after 6 the
    // attention is still near uniform, and a rotation by the wrong sign
    // changed the tied model's logits by less than the tolerance.
    runs["llama"] = test::trainDeployRun(*dir_, test::DeployModel::llama);
    auto llamaJob = [&](const std::string& name, const std::string& extraModel) {
      return "name: " + name + R"(
model:
  arch: llama
  n_layer: 2
  n_head: 4
  n_embd: 32
  intermediate_size: 40
  block_size: 12
)" + extraModel +
             R"(
data:
  train: {kind: tokens, path: )" +
             tokens + R"(}
training: {epochs: 1, max_steps: 40, batch_size: 8, optimizer: {name: adamw, lr: 0.02}}
)";
    };
    runs["llama_tied"] = trainJob(*dir_, "llama_tied",
                                  llamaJob("llama_tied",
                                           "  n_kv_head: 1\n  tie_embeddings: true\n"
                                           "  rope: {theta: 500, scaling: linear, factor: 2}"));
    runs["llama_base"] = trainJob(*dir_, "llama_base", llamaJob("llama_base", "  n_kv_head: 2"));
    runs["llama_lora"] = trainJob(*dir_, "llama_lora",
                                  llamaJob("llama_lora", "  n_kv_head: 2\n  init_from: " + runs["llama_base"] +
                                                             "/model/final.pt\n"
                                                             "  lora: {rank: 2, alpha: 8, targets: [attn, mlp]}"));
    const test::ProcessResult made = test::run(
        {COHORT_PYTHON, test::sourceDir() + "/tests/train/scripted_models.py", "make", dir_->path(), "cnn"});
    EXPECT_EQ(made.exitCode, 0) << made.describe();
    runs["scripted"] = trainJob(*dir_, "scripted",
                                R"(name: scripted
model: {arch: torchscript, path: )" +
                                    dir_->file("cnn.pt") + R"(, num_classes: 4}
data:
  train: {kind: synthetic, size: 16, shape: [1, 8, 8], seed: 2, mean: [0.45], std: [0.3]}
training: {epochs: 1, max_steps: 2, batch_size: 8, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
)");
  }
  static void TearDownTestSuite() {
    delete runs_;
    delete dir_;
  }

  static const std::string& runOf(const std::string& name) { return runs_->at(name); }

  // `cohort export RUN --format FORMAT --out <tmp>/<name>.<ext> extra...`;
  // returns the file, failing the test when the command does not succeed.
  std::string exportTo(const std::string& run, const std::string& format, const std::string& name,
                       std::vector<std::string> extra = {}) {
    const std::string out = tmp_.file(name + (format == "onnx" ? ".onnx" : ".ts.pt"));
    std::vector<std::string> args{"export", run, "--format", format, "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    const test::ProcessResult r = test::cohort(args);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_NE(r.out.find("wrote " + out), std::string::npos) << r.out;
    return out;
  }

  // onnx.checker.check_model(full_check=True); the graph's description.
  nlohmann::json checkOnnx(const std::string& model) {
    const test::ProcessResult r =
        test::run({COHORT_PYTHON, test::sourceDir() + "/tests/serve/export_check.py", "onnx", model});
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return r.exitCode == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  }

  // ONNX Runtime's telemetry leaves an empty mat-debug-<pid>.log in the
  // temporary directory of every process that opens a session: the test's own.
  std::map<std::string, std::string> ortEnv() const { return {{"TMPDIR", tmp_.path()}}; }

  // The model's logits for `input` from ONNX Runtime.
  at::Tensor runOnnx(const std::string& model, const at::Tensor& input) {
    const bool tokens = input.scalar_type() == torch::kLong;
    const std::string in = tmp_.file("input.bin"), out = tmp_.file("output.bin");
    writeRaw(in, input);
    const test::ProcessResult r =
        test::run({"/usr/bin/node", test::sourceDir() + "/tests/serve/ort_run.js", model,
                   tokens ? "tokens" : "pixels", tokens ? "int64" : "float32", dimsText(input), in, out},
                  ortEnv());
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    if (r.exitCode != 0) return {};
    return readFloats(out, nlohmann::json::parse(r.out).at("dims").get<std::vector<int64_t>>());
  }

  // The logits of Python's torch.jit.load(model) for `input`; `info` gets cohort.json.
  at::Tensor runPythonScript(const std::string& model, const at::Tensor& input,
                             nlohmann::json* info = nullptr) {
    const std::string in = tmp_.file("input.bin"), out = tmp_.file("output.bin");
    writeRaw(in, input);
    const test::ProcessResult r =
        test::run({COHORT_PYTHON, test::sourceDir() + "/tests/serve/export_check.py", "torchscript", model,
                   input.scalar_type() == torch::kLong ? "int64" : "float32", dimsText(input), in, out});
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    if (r.exitCode != 0) return {};
    const nlohmann::json j = nlohmann::json::parse(r.out);
    if (info != nullptr) *info = j.at("info");
    return readFloats(out, j.at("dims").get<std::vector<int64_t>>());
  }

  // Exports `name` as ONNX and compares ONNX Runtime with cohort's forward
  // at batch sizes 1 and 3 (and two sequence lengths for a language model).
  void expectOnnxMatches(const std::string& name) {
    const std::string run = runOf(name);
    const std::string model = exportTo(run, "onnx", name);
    const nlohmann::json g = checkOnnx(model);
    auto predictor = serve::openPredictor(run);
    const serve::ModelInfo& info = predictor->info();
    EXPECT_EQ(g.value("producer", ""), "cohort");
    EXPECT_EQ(g.value("opset", nlohmann::json()), nlohmann::json::parse(R"([["", 17]])"));
    EXPECT_EQ(g["metadata"].value("opset", ""), "17");
    ASSERT_TRUE(g["metadata"].contains("cohort")) << g.dump();
    EXPECT_EQ(nlohmann::json::parse(g["metadata"]["cohort"].get<std::string>()), info.toJson());
    const std::string in = info.tokens ? "tokens" : "pixels";
    ASSERT_TRUE(g["inputs"].contains(in)) << g.dump();
    EXPECT_EQ(g["inputs"][in][0], "batch");
    EXPECT_EQ(g["outputs"]["logits"][0], "batch");
    if (info.tokens) {
      EXPECT_EQ(g["inputs"][in][1], "time");
    }
    for (int64_t batch : {1, 3}) {
      const at::Tensor x =
          inputFor(info, batch, batch == 1 ? info.blockSize : 5, 100 + static_cast<uint64_t>(batch));
      const at::Tensor expected = predictor->forward(x);
      const at::Tensor actual = runOnnx(model, x);
      ASSERT_TRUE(actual.defined());
      EXPECT_TRUE(closeTo(expected, actual)) << name << " batch " << batch;
    }
  }

  // Exports `name` as TorchScript; Python's torch.jit.load and
  // openPredictor(export) give cohort's logits at batch sizes 1 and 4.
  void expectTorchScriptMatches(const std::string& name) {
    const std::string run = runOf(name);
    const std::string model = exportTo(run, "torchscript", name);
    auto reference = serve::openPredictor(run);
    auto exported = serve::openPredictor(model);
    const serve::ModelInfo& info = reference->info();
    EXPECT_EQ(exported->info().toJson(), info.toJson());
    for (int64_t batch : {1, 4}) {
      const at::Tensor x =
          inputFor(info, batch, batch == 1 ? 3 : info.blockSize, 200 + static_cast<uint64_t>(batch));
      const at::Tensor expected = reference->forward(x);
      nlohmann::json carried;
      const at::Tensor python = runPythonScript(model, x, &carried);
      ASSERT_TRUE(python.defined());
      EXPECT_TRUE(closeTo(expected, python)) << name << " (Python) batch " << batch;
      EXPECT_EQ(carried, info.toJson());
      EXPECT_TRUE(closeTo(expected, exported->forward(x))) << name << " (openPredictor) batch " << batch;
    }
  }

  test::TempDir tmp_;
  static test::TempDir* dir_;
  static std::map<std::string, std::string>* runs_;
};
test::TempDir* ExportTest::dir_ = nullptr;
std::map<std::string, std::string>* ExportTest::runs_ = nullptr;

TEST_F(ExportTest, OnnxOfASimpleCnnWithBatchNorm) { expectOnnxMatches("cnn"); }
TEST_F(ExportTest, OnnxOfASimpleCnnWithoutBatchNormOnThreeChannels) { expectOnnxMatches("cnn_plain"); }
TEST_F(ExportTest, OnnxOfAResNet18WithTheSmallInputStem) { expectOnnxMatches("resnet18"); }
TEST_F(ExportTest, OnnxOfAResNet50WithTheImageNetStem) { expectOnnxMatches("resnet50"); }
TEST_F(ExportTest, OnnxOfAResNet101) { expectOnnxMatches("resnet101"); }
TEST_F(ExportTest, OnnxOfAGpt) { expectOnnxMatches("gpt"); }
TEST_F(ExportTest, OnnxOfAGptWithoutBiases) { expectOnnxMatches("gpt_nobias"); }
TEST_F(ExportTest, OnnxOfALoraRunHoldsTheMergedWeights) {
  // The adapters trained away from the base: without them the logits differ.
  auto lora = serve::openPredictor(runOf("gpt_lora"));
  auto base = serve::openPredictor(runOf("gpt_nobias"));
  const at::Tensor x = inputFor(lora->info(), 2, 6, 9);
  EXPECT_GT((lora->forward(x) - base->forward(x)).abs().max().item<double>(), 1e-3);
  expectOnnxMatches("gpt_lora");
}

TEST_F(ExportTest, OnnxOfALlamaWithGroupedQueryAttentionAndAnUntiedHead) { expectOnnxMatches("llama"); }
TEST_F(ExportTest, OnnxOfATiedLlamaOnOneKeyValueHeadWithScaledRotaryAngles) { expectOnnxMatches("llama_tied"); }
TEST_F(ExportTest, OnnxOfALlamaLoraRunHoldsTheMergedWeights) {
  auto lora = serve::openPredictor(runOf("llama_lora"));
  auto base = serve::openPredictor(runOf("llama_base"));
  const at::Tensor x = inputFor(lora->info(), 2, 6, 9);
  EXPECT_GT((lora->forward(x) - base->forward(x)).abs().max().item<double>(), 1e-3);
  expectOnnxMatches("llama_lora");
}

TEST_F(ExportTest, TorchScriptOfALlama) {
  for (const char* name : {"llama", "llama_tied", "llama_lora"}) {
    SCOPED_TRACE(name);
    expectTorchScriptMatches(name);
  }
}

TEST_F(ExportTest, TorchScriptOfEachBuiltInArchitecture) {
  for (const char* name :
       {"cnn", "cnn_plain", "resnet18", "resnet50", "resnet101", "gpt", "gpt_nobias", "gpt_lora"}) {
    SCOPED_TRACE(name);
    expectTorchScriptMatches(name);
  }
}

TEST_F(ExportTest, TorchScriptOfAUsersScriptedModuleWrapsItWithTheNormalization) {
  expectTorchScriptMatches("scripted");
}

TEST_F(ExportTest, AFixedBatchIsTheGraphsOnlyBatch) {
  const std::string model = exportTo(runOf("cnn"), "onnx", "fixed", {"--batch", "2"});
  const nlohmann::json g = checkOnnx(model);
  EXPECT_EQ(g["inputs"]["pixels"], nlohmann::json::parse("[2, 1, 28, 28]"));
  EXPECT_EQ(g["outputs"]["logits"], nlohmann::json::parse("[2, 4]"));
  auto predictor = serve::openPredictor(runOf("cnn"));
  const at::Tensor x = inputFor(predictor->info(), 2, 0, 7);
  EXPECT_TRUE(closeTo(predictor->forward(x), runOnnx(model, x)));
  // ONNX Runtime refuses another batch size for it.
  const at::Tensor three = inputFor(predictor->info(), 3, 0, 8);
  writeRaw(tmp_.file("three.bin"), three);
  const test::ProcessResult r =
      test::run({"/usr/bin/node", test::sourceDir() + "/tests/serve/ort_run.js", model, "pixels", "float32",
                 dimsText(three), tmp_.file("three.bin"), tmp_.file("out.bin")},
                ortEnv());
  EXPECT_NE(r.exitCode, 0) << r.describe();
}

TEST_F(ExportTest, WritesIntoTheRunsModelDirectoryByDefaultAndSaysWhat) {
  // A copy: the suite's runs stay as the other cases expect them.
  const std::string run = tmp_.file("gpt-run");
  fs::copy(runOf("gpt"), run, fs::copy_options::recursive);
  const test::ProcessResult r = test::cohort({"export", run, "--format", "onnx"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(fs::is_regular_file(run + "/model/model.onnx"));
  for (const char* part :
       {"model/model.onnx", "opset 17", "tokens int64 [batch, time]", "logits float32 [batch, time, 256]"}) {
    EXPECT_NE(r.out.find(part), std::string::npos) << part << " in " << r.out;
  }
  const test::ProcessResult ts = test::cohort({"export", run, "--format", "torchscript"});
  ASSERT_EQ(ts.exitCode, 0) << ts.describe();
  EXPECT_TRUE(fs::is_regular_file(run + "/model/model.ts.pt"));

  // A weights file outside a run directory, with --job: beside it.
  fs::copy_file(runOf("cnn") + "/model/final.pt", tmp_.file("weights.pt"));
  const test::ProcessResult beside = test::cohort(
      {"export", tmp_.file("weights.pt"), "--job", runOf("cnn") + "/job.yaml", "--format", "onnx"});
  ASSERT_EQ(beside.exitCode, 0) << beside.describe();
  EXPECT_TRUE(fs::is_regular_file(tmp_.file("weights.onnx"))) << beside.out;
}

TEST_F(ExportTest, BadInputExitsTwoWithAMessageAndWritesNothing) {
  struct Bad {
    std::vector<std::string> args;
    std::string says;
  };
  const std::string cnn = runOf("cnn"), scripted = runOf("scripted");
  const std::string out = tmp_.file("bad.onnx");
  const std::vector<Bad> cases = {
      {{"export", cnn, "--format", "tflite", "--out", out}, "tflite"},
      {{"export", tmp_.file("missing"), "--format", "onnx", "--out", out}, "no such file"},
      {{"export", scripted, "--format", "onnx", "--out", out}, "--format torchscript"},
      {{"export", cnn, "--format", "onnx", "--batch", "0", "--out", out}, "--batch 0"},
      {{"export", cnn, "--format", "onnx", "--batch", "many", "--out", out}, "--batch many"},
      {{"export", cnn, "--format", "onnx", "--batch", "2x", "--out", out}, "--batch 2x"},
      {{"export", cnn, "--format", "torchscript", "--batch", "4", "--out", out},
       "--batch applies to --format onnx"},
      {{"export", cnn, "--format", "onnx", "--opset", "13", "--out", out}, "13"},
      {{"export", cnn + "/model/final.pt", "--format", "onnx", "--job", tmp_.file("none.yaml"), "--out", out},
       "none.yaml"},
  };
  for (const Bad& b : cases) {
    const test::ProcessResult r = test::cohort(b.args);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE((r.err + r.out).find(b.says), std::string::npos) << b.says << " in " << r.describe();
    EXPECT_FALSE(fs::exists(out)) << r.describe();
  }
  // A weights file copied out of its run directory: the job must be named.
  fs::copy_file(cnn + "/model/final.pt", tmp_.file("lone.pt"));
  const test::ProcessResult lone = test::cohort({"export", tmp_.file("lone.pt"), "--format", "onnx"});
  EXPECT_EQ(lone.exitCode, 2) << lone.describe();
  EXPECT_NE(lone.err.find("--job"), std::string::npos) << lone.describe();
}

}  // namespace
}  // namespace cohort
