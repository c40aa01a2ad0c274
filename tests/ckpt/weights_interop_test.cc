// Weights in the formats people bring, against writers and readers made
// from the published formats alone (tests/ckpt/hf_interop.py, Debian's
// python3-torch; no safetensors or transformers package): safetensors both
// ways, and GPT-2 in Hugging Face's layout loaded into cohort's gpt and
// exported back, with the same logits.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "cohort/ckpt/safetensors.h"
#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "cohort/models/hf_gpt2.h"
#include "cohort/models/pretrained.h"
#include "cohort/models/model.h"
#include "serve/detail/exporters.h"
#include "test_paths.h"
#include "util/errors.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/python.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

class WeightsInterop : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(test::pythonImports("torch")); }
  test::ProcessResult py(const std::string& mode) {
    return test::run({COHORT_PYTHON, test::sourceDir() + "/tests/ckpt/hf_interop.py", mode, dir.path()});
  }
  test::TempDir dir;
};

// hf_interop.py's CONFIG, as a job's model section.
ModelConfig hfSizes() {
  ModelConfig c;
  c.arch = ModelArch::gpt;
  c.vocabSize = 96;
  c.blockSize = 24;
  c.nEmbd = 48;
  c.nLayer = 2;
  c.nHead = 4;
  c.activation = Activation::geluTanh;
  return c;
}

TEST_F(WeightsInterop, SafetensorsFromAnIndependentWriterAndToAnIndependentReader) {
  auto r = py("write-st");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const ckpt::StateDict want = ckpt::readStateDict(dir.file("py_ref.pt"));
  ckpt::SafetensorsFile file(dir.file("py.safetensors"));
  EXPECT_EQ(file.metadata().at("written_by"), "hf_interop.py");
  ASSERT_EQ(file.entries().size(), want.size());
  for (const auto& [name, t] : want) {
    const at::Tensor got = file.load(name);
    EXPECT_EQ(got.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(got, t)) << name;
  }
  // Back: cohort's file read by the script's own reader.
  ckpt::saveSafetensors(want, dir.file("cohort.safetensors"), {{"by", "cohort"}});
  ckpt::saveStateDict(want, dir.file("cohort_ref.pt"));
  r = py("read-st");
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.out.find("\"by\": \"cohort\""), std::string::npos) << r.out;
  // Negative control: a tensor changed after the reference was written.
  ckpt::StateDict changed = want;
  changed[0].second = changed[0].second + 1;
  ckpt::saveSafetensors(changed, dir.file("cohort.safetensors"));
  EXPECT_EQ(py("read-st").exitCode, 1);
}

TEST_F(WeightsInterop, AHuggingFaceGpt2CheckpointLoadsStrictlyWithItsLogits) {
  auto r = py("hf-make");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const ckpt::StateDict io = ckpt::readStateDict(dir.file("hf_io.pt"));
  // GPT2LMHeadModel's names in a pytorch_model.bin; GPT2Model's in a
  // model.safetensors of the script's writer; and that file alone.
  double tanhDiff = 0;
  for (const std::string& from : {dir.file("hf"), dir.file("hf2"), dir.file("hf2/model.safetensors")}) {
    SCOPED_TRACE(from);
    const ModelConfig mc = hfSizes();
    auto model = models::createModel(mc, {});
    auto source = models::openPretrained(from, mc);
    models::loadWeights(*model, *source, from);
    model->eval();
    torch::NoGradGuard g;
    const double diff =
        (model->forward(test::tensorNamed(io, "tokens")) - test::tensorNamed(io, "logits")).abs().max().item<double>();
    EXPECT_LT(diff, 1e-4);
    RecordProperty("max_logit_difference", std::to_string(diff));
    tanhDiff = std::max(tanhDiff, diff);
  }
  // With the exact GELU instead the logits are further off (GPT-2's small
  // weights keep both close): the activation matters, and a config.json
  // that says gelu_new refuses it.
  ModelConfig exact = hfSizes();
  exact.activation = Activation::gelu;
  EXPECT_NE(test::errorOf<DataError>([&] { models::openPretrained(dir.file("hf"), exact); })
                .find("activation_function gelu_new is model.activation gelu_tanh; the job has gelu"),
            std::string::npos);
  auto model = models::createModel(exact, {});
  fs::copy_file(dir.file("hf2/model.safetensors"), dir.file("alone.safetensors"));  // no config.json beside it
  auto source = models::openPretrained(dir.file("alone.safetensors"), exact);
  models::loadWeights(*model, *source, "alone.safetensors");
  model->eval();
  torch::NoGradGuard g;
  const double exactDiff =
      (model->forward(test::tensorNamed(io, "tokens")) - test::tensorNamed(io, "logits")).abs().max().item<double>();
  EXPECT_GT(exactDiff, 10 * tanhDiff) << "exact " << exactDiff << ", tanh " << tanhDiff;
}

TEST_F(WeightsInterop, CohortsGptExportsToTheHuggingFaceLayoutAndBack) {
  ASSERT_EQ(py("hf-make").exitCode, 0);  // only for its CONFIG's sizes; the weights here are cohort's
  serve::TrainedModel m;
  m.job.model = hfSizes();
  m.info.arch = "gpt";
  m.info.tokens = true;
  m.info.vocabSize = 96;
  torch::manual_seed(21);
  m.model = models::createModel(m.job.model, {});
  {
    torch::NoGradGuard g;
    for (auto& p : m.model->named_parameters()) {
      if (p.key().find(".ln_") != std::string::npos || p.key().find("ln_f") != std::string::npos) {
        p.value().normal_(1.0, 0.1);
      }
    }
  }
  m.model->eval();
  const at::Tensor tokens = torch::randint(0, 96, {2, 24}, torch::kLong);
  at::Tensor logits;
  {
    torch::NoGradGuard g;
    logits = m.model->forward(tokens);
  }
  serve::detail::writeHuggingFace(m, dir.file("export"));
  ckpt::saveStateDict({{"tokens", tokens}, {"logits", logits}}, dir.file("cohort_io.pt"));
  auto r = py("hf-check");
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  RecordProperty("reference", r.out);
  // And back into cohort: the same tensors, bit for bit.
  auto again = models::createModel(m.job.model, {});
  auto source = models::openPretrained(dir.file("export"), m.job.model);
  models::loadWeights(*again, *source, "export");
  const ckpt::StateDict a = ckpt::stateDict(*m.model), b = ckpt::stateDict(*again);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  // Negative control: logits off by 1e-3 fail the script's check.
  ckpt::saveStateDict({{"tokens", tokens}, {"logits", logits + 1e-3}}, dir.file("cohort_io.pt"));
  EXPECT_EQ(py("hf-check").exitCode, 1);
}

TEST_F(WeightsInterop, CheckpointsOfAnotherModelAreRefusedNamingTheFileAndKey) {
  ASSERT_EQ(py("hf-make").exitCode, 0);
  const ModelConfig mc = hfSizes();
  auto rewrite = [&](const std::string& from, const std::string& to) {
    std::string c = test::readText(dir.file("hf/config.json"));
    const size_t at = c.find(from);
    ASSERT_NE(at, std::string::npos);
    test::writeText(dir.file("hf/config.json"), c.replace(at, from.size(), to));
  };
  const std::string original = test::readText(dir.file("hf/config.json"));
  rewrite("\"model_type\": \"gpt2\"", "\"model_type\": \"llama\"");
  std::string e = test::errorOf<DataError>([&] { models::openPretrained(dir.file("hf"), mc); });
  EXPECT_NE(e.find("config.json: model_type 'llama'"), std::string::npos) << e;
  test::writeText(dir.file("hf/config.json"), original);
  rewrite("\"n_head\": 4", "\"n_head\": 6");
  e = test::errorOf<DataError>([&] { models::openPretrained(dir.file("hf"), mc); });
  EXPECT_NE(e.find("n_head is 6, the job's model.n_head is 4"), std::string::npos) << e;
  test::writeText(dir.file("hf/config.json"), original);
  // Weights of another architecture without a config.json: the strict load
  // names the first tensor cohort's gpt does not have.
  ckpt::saveSafetensors({{"model.layers.0.self_attn.q_proj.weight", torch::zeros({4, 4})}},
                        dir.file("llama.safetensors"));
  auto model = models::createModel(mc, {});
  e = test::errorOf<DataError>([&] {
    auto s = models::openPretrained(dir.file("llama.safetensors"), mc);
    models::loadWeights(*model, *s, dir.file("llama.safetensors"));
  });
  EXPECT_NE(e.find("llama.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("transformer."), std::string::npos) << e;
  // A directory without weights.
  fs::remove(dir.file("hf/pytorch_model.bin"));
  e = test::errorOf<DataError>([&] { models::openPretrained(dir.file("hf"), mc); });
  EXPECT_NE(e.find("none of model.safetensors, model.safetensors.index.json, pytorch_model.bin"), std::string::npos) << e;
}

}  // namespace
}  // namespace cohort
