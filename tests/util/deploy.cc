#include "util/deploy.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_paths.h"
#include "util/corpus.h"
#include "util/jobs.h"

namespace cohort::test {

namespace {

const char* kCommon = R"(
distribution: {procs_per_node: 1, threads_per_rank: 1, timeout_s: 60}
output: {progress: off}
checkpoint: {enabled: false}
)";

std::string jobFor(const TempDir& dir, DeployModel kind, const std::string& base) {
  switch (kind) {
    case DeployModel::cnn:
      return R"(name: cnn
model: {arch: simple_cnn, num_classes: 4, width: 4, hidden: 16, batch_norm: true}
data:
  train: {kind: synthetic, size: 64, shape: [1, 28, 28], seed: 3, mean: [0.3], std: [0.2]}
training: {epochs: 1, max_steps: 4, batch_size: 16, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
)" + std::string(kCommon);
    case DeployModel::resnet:
      return R"(name: resnet
model: {arch: resnet18, num_classes: 5, small_input: true}
data:
  train: {kind: synthetic, size: 16, shape: [3, 32, 32], seed: 5, mean: [0.5, 0.4, 0.3], std: [0.25, 0.2, 0.3]}
training: {epochs: 1, max_steps: 2, batch_size: 8, optimizer: {name: sgd, lr: 0.01, momentum: 0.9}}
)" + std::string(kCommon);
    case DeployModel::gpt:
      return R"(name: gpt
model: {arch: gpt, n_layer: 1, n_head: 2, n_embd: 32, block_size: 16}
data:
  train: {kind: tokens, path: )" + base + R"(/tok/train}
training: {epochs: 1, max_steps: 6, batch_size: 8, optimizer: {name: adamw, lr: 0.003}}
)" + std::string(kCommon);
    case DeployModel::llama:
      return R"(name: llama
model: {arch: llama, n_layer: 1, n_head: 4, n_kv_head: 2, n_embd: 32, intermediate_size: 48, block_size: 16}
data:
  train: {kind: tokens, path: )" + base + R"(/tok/train}
training: {epochs: 1, max_steps: 6, batch_size: 8, optimizer: {name: adamw, lr: 0.003}}
)" + std::string(kCommon);
    case DeployModel::imageShards:
      return R"(name: shards
model: {arch: simple_cnn, num_classes: 3, width: 4, hidden: 16, batch_norm: true}
data:
  train: {kind: shards, path: )" + base + R"(/shards, crop_size: 32, mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}
training: {epochs: 2, batch_size: 6, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
)" + std::string(kCommon);
  }
  (void)dir;
  return "";
}

const char* nameOf(DeployModel kind) {
  switch (kind) {
    case DeployModel::cnn: return "cnn";
    case DeployModel::resnet: return "resnet";
    case DeployModel::gpt: return "gpt";
    case DeployModel::llama: return "llama";
    case DeployModel::imageShards: return "shards";
  }
  return "?";
}

}  // namespace

std::string makeImageFolder(const std::string& root, int perClass) {
  const std::string script = R"(
import os, sys
from PIL import Image
root, n = sys.argv[1], int(sys.argv[2])
colors = {"red": (200, 30, 40), "green": (30, 180, 50), "blue": (40, 50, 210)}
for name, (r, g, b) in colors.items():
    os.makedirs(os.path.join(root, name), exist_ok=True)
    for i in range(n):
        for ext, (w, h) in (("jpg", (40, 48)), ("png", (52, 36))):
            img = Image.new("RGB", (w, h))
            px = img.load()
            for y in range(h):
                for x in range(w):
                    k = (x * (i + 2) + y * 3) % 40
                    px[x, y] = (min(255, r + k), min(255, g + k), min(255, b + k))
            img.save(os.path.join(root, name, "%s-%d.%s" % (name, i, ext)))
)";
  std::filesystem::create_directories(root);
  writeText(root + ".py", script);
  const ProcessResult r = run({COHORT_PYTHON, root + ".py", root, std::to_string(perClass)});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  std::filesystem::remove(root + ".py");
  return root;
}

std::string trainDeployRun(const TempDir& dir, DeployModel kind) {
  const std::string base = dir.file(nameOf(kind));
  std::filesystem::create_directories(base);
  if (kind == DeployModel::gpt || kind == DeployModel::llama) {
    writeText(base + "/corpus.txt", corpus(8'000));
    const ProcessResult t = cohort({"data", "tokenize", base + "/corpus.txt", base + "/tok", "--no-progress"});
    EXPECT_EQ(t.exitCode, 0) << t.describe();
  }
  if (kind == DeployModel::imageShards) {
    makeImageFolder(base + "/images", 4);
    const ProcessResult p = cohort({"data", "pack", base + "/images", base + "/shards", "--no-progress"});
    EXPECT_EQ(p.exitCode, 0) << p.describe();
  }
  writeText(base + "/job.yaml", jobFor(dir, kind, base));
  const std::string runDir = base + "/run";
  const ProcessResult r = cohort({"run", base + "/job.yaml", "--run-dir", runDir});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(std::filesystem::is_regular_file(runDir + "/model/final.pt")) << runDir;
  return runDir;
}

TempDir* DeployRunsTest::dir_ = nullptr;
std::string* DeployRunsTest::cnn_ = nullptr;
std::string* DeployRunsTest::shards_ = nullptr;
std::string* DeployRunsTest::gpt_ = nullptr;

void DeployRunsTest::SetUpTestSuite() {
  dir_ = new TempDir;
  cnn_ = new std::string(trainDeployRun(*dir_, DeployModel::cnn));
  shards_ = new std::string(trainDeployRun(*dir_, DeployModel::imageShards));
  gpt_ = new std::string(trainDeployRun(*dir_, DeployModel::gpt));
}

void DeployRunsTest::TearDownTestSuite() {
  for (std::string* s : {cnn_, shards_, gpt_}) delete s;
  delete dir_;
  cnn_ = shards_ = gpt_ = nullptr;
  dir_ = nullptr;
}

}  // namespace cohort::test
