// State dicts move between cohort and PyTorch (Debian's python3-torch and
// python3-torchvision) in both directions, and give the same logits.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/ckpt/state_dict.h"
#include "cohort/models/gpt.h"
#include "cohort/models/model.h"
#include "test_paths.h"
#include "util/jobs.h"
#include "util/python.h"
#include "util/gpt.h"

namespace cohort {
namespace {

class PythonInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(test::pythonImports("torch, torchvision"));
  }
  std::string script() const { return test::sourceDir() + "/tests/ckpt/interop.py"; }
  test::TempDir dir;
};

std::shared_ptr<models::Model> resnet(const std::string& arch) {
  ModelConfig c;
  c.arch = choiceFromName<ModelArch>(arch).value();
  c.numClasses = 10;
  return models::createModel(c, {3, 64, 64});
}

TEST_F(PythonInterop, TorchvisionWeightsGiveTorchvisionLogits) {
  auto r = test::run({COHORT_PYTHON, script(), "export", dir.path()});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto model = resnet("resnet18");
  ckpt::loadStateDict(*model, ckpt::readStateDict(dir.file("tv_resnet18.pt")), "tv_resnet18.pt");
  model->eval();
  auto io = ckpt::readStateDict(dir.file("tv_io.pt"));
  torch::NoGradGuard g;
  at::Tensor y = model->forward(test::tensorNamed(io, "input"));
  const double diff = (y - test::tensorNamed(io, "logits")).abs().max().item<double>();
  EXPECT_LT(diff, 1e-4) << "cohort's logits differ from PyTorch's";
  RecordProperty("max_logit_difference", std::to_string(diff));

  // A checkpoint dict holding the weights under "state_dict" works too.
  auto fromCheckpoint = ckpt::readStateDict(dir.file("tv_checkpoint.pt"));
  EXPECT_EQ(fromCheckpoint.size(), ckpt::stateDict(*model).size());
}

// A state dict written tensor by tensor (ZeRO stage 3's final save) is one
// torch.load reads, a tied tensor's two names on one storage.
TEST_F(PythonInterop, AStateDictWrittenTensorByTensorLoadsInPyTorch) {
  const at::Tensor w = torch::randn({5, 3});
  const ckpt::StateDict ref = {{"w", w},
                               {"w2", w},
                               {"b", torch::randn({3}, torch::kFloat64)},
                               {"n", torch::tensor(int64_t{1} << 40)},
                               {"h", torch::randn({2, 2}).to(torch::kBFloat16)}};
  ckpt::saveStateDict(ref, dir.file("streamed_ref.pt"));
  ckpt::StateDictWriter out(dir.file("streamed.pt"));
  out.add("h", ref[4].second);
  out.add("w", w);
  out.add("b", ref[2].second);
  out.add("n", ref[3].second);
  out.alias("w2", "w");
  out.finish({"w", "w2", "b", "n", "h"});
  auto r = test::run({COHORT_PYTHON, script(), "streamed", dir.path()});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
}

TEST_F(PythonInterop, CohortWeightsLoadIntoTorchvision) {
  for (const std::string arch : {"resnet18", "resnet50"}) {
    torch::manual_seed(5);
    auto model = resnet(arch);
    {
      torch::NoGradGuard g;
      model->train();
      for (int i = 0; i < 3; ++i) model->forward(torch::randn({4, 3, 64, 64}));
    }
    model->eval();
    at::Tensor x = torch::randn({2, 3, 64, 64});
    at::Tensor y;
    {
      torch::NoGradGuard g;
      y = model->forward(x);
    }
    ckpt::saveStateDict(ckpt::stateDict(*model), dir.file("cohort_" + arch + ".pt"));
    ckpt::saveStateDict({{"input", x}, {"logits", y}}, dir.file("cohort_" + arch + "_io.pt"));
    auto r = test::run({COHORT_PYTHON, script(), "check", dir.path(), arch});
    EXPECT_EQ(r.exitCode, 0) << arch << "\n" << r.describe();
  }
}

TEST_F(PythonInterop, GptWeightsGiveTheReferenceModulesLogits) {
  // bench/peers/gpt.py is the same architecture in PyTorch: cohort's
  // published state dict (model/final.pt's, with the tied head's second
  // name) loads into it strictly and the logits agree.
  models::GptOptions o = test::gptSizes(64, 16, 2, 2, 32);
  torch::manual_seed(7);
  auto model = models::createGpt(o);
  model->eval();
  const at::Tensor tokens = torch::randint(0, 64, {3, 16}, torch::kLong);
  at::Tensor logits;
  {
    torch::NoGradGuard g;
    logits = model->forward(tokens);
  }
  ckpt::saveStateDict(models::publishedStateDict(*model), dir.file("cohort_gpt.pt"));
  const std::vector<std::string> check{COHORT_PYTHON, test::sourceDir() + "/bench/peers/gpt.py", "check",
                                       dir.path(), "--vocab-size", "64", "--block-size", "16",
                                       "--n-layer", "2", "--n-head", "2", "--n-embd", "32",
                                       "--tolerance", "1e-5"};
  ckpt::saveStateDict({{"tokens", tokens}, {"logits", logits}}, dir.file("cohort_gpt_io.pt"));
  auto r = test::run(check);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  RecordProperty("reference", r.out);
  // Negative control: logits off by 1e-3 fail the same check.
  ckpt::saveStateDict({{"tokens", tokens}, {"logits", logits + 1e-3}}, dir.file("cohort_gpt_io.pt"));
  r = test::run(check);
  EXPECT_EQ(r.exitCode, 1) << r.describe();
}

TEST_F(PythonInterop, InitFromInAJob) {
  auto r = test::run({COHORT_PYTHON, script(), "export", dir.path()});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string job = dir.file("job.yaml");
  test::writeText(job, R"(name: init
model: {arch: resnet18, num_classes: 10}
data:
  train: {kind: synthetic, size: 8, shape: [3, 64, 64]}
training: {max_steps: 1, batch_size: 4}
distribution: {procs_per_node: 1}
output: {progress: off}
)");
  auto ok = test::cohort({"run", job, "--run-dir", dir.file("run1"), "--set",
                          "model.init_from=" + dir.file("tv_resnet18.pt")});
  EXPECT_EQ(ok.exitCode, 0) << ok.describe();
  EXPECT_NE(ok.err.find("initialized from " + dir.file("tv_resnet18.pt")), std::string::npos);

  auto bad = test::cohort({"run", job, "--run-dir", dir.file("run2"), "--set",
                           "model.arch=resnet34", "--set",
                           "model.init_from=" + dir.file("tv_resnet18.pt")});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_NE(bad.err.find(dir.file("tv_resnet18.pt") +
                         ": missing tensor 'layer1.2.conv1.weight' (shape [64, 64, 3, 3])"),
            std::string::npos)
      << bad.err;
}

}  // namespace
}  // namespace cohort
