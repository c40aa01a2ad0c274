// The trained model the deploy commands start from (serve/model.h): what
// loadTrainedModel learns from a run directory, the forms MODEL can take,
// the raw-pixel contract, and the inputs a Predictor refuses.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/serve/model.h"
#include "util/deploy.h"
#include "util/errors.h"
#include "util/jobs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

// `f` throws an E whose message holds every one of `parts`.
template <class E, class F>
void expectThrowsWith(F&& f, std::initializer_list<std::string> parts) {
  const std::string message = test::errorOf<E>(f);
  for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

class TrainedModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    cnn_ = new std::string(test::trainDeployRun(*dir_, test::DeployModel::cnn));
    shards_ = new std::string(test::trainDeployRun(*dir_, test::DeployModel::imageShards));
    gpt_ = new std::string(test::trainDeployRun(*dir_, test::DeployModel::gpt));
  }
  static void TearDownTestSuite() {
    delete cnn_;
    delete shards_;
    delete gpt_;
    delete dir_;
  }
  static test::TempDir* dir_;
  static std::string *cnn_, *shards_, *gpt_;
};
test::TempDir* TrainedModelTest::dir_ = nullptr;
std::string* TrainedModelTest::cnn_ = nullptr;
std::string* TrainedModelTest::shards_ = nullptr;
std::string* TrainedModelTest::gpt_ = nullptr;

TEST_F(TrainedModelTest, LearnsTheInputFromTheJobsData) {
  const serve::TrainedModel cnn = serve::loadTrainedModel(*cnn_);
  EXPECT_EQ(cnn.info.arch, "simple_cnn");
  EXPECT_FALSE(cnn.info.tokens);
  EXPECT_EQ(cnn.info.channels, 1);
  EXPECT_EQ(cnn.info.height, 28);
  EXPECT_EQ(cnn.info.width, 28);
  EXPECT_EQ(cnn.info.mean, std::vector<double>({0.3f}));  // the job's float32 value, widened
  EXPECT_EQ(cnn.info.resize, 28);
  EXPECT_EQ(cnn.info.numClasses, 4);
  EXPECT_TRUE(cnn.info.classes.empty());
  EXPECT_EQ(cnn.info.className(2), "2");
  EXPECT_EQ(cnn.info.weights, *cnn_ + "/model/final.pt");
  EXPECT_FALSE(cnn.model->is_training());

  const serve::TrainedModel shards = serve::loadTrainedModel(*shards_);
  EXPECT_EQ(shards.info.channels, 3);
  EXPECT_EQ(shards.info.height, 32);
  EXPECT_EQ(shards.info.resize, 37);  // crop_size / 0.875, as the eval transform
  EXPECT_EQ(shards.info.classes, std::vector<std::string>({"blue", "green", "red"}));
  EXPECT_EQ(shards.info.className(0), "blue");
  EXPECT_EQ(shards.info.mean.size(), 3u);

  const serve::TrainedModel gpt = serve::loadTrainedModel(*gpt_);
  EXPECT_TRUE(gpt.info.tokens);
  EXPECT_EQ(gpt.info.tokenizer, "bytes");
  EXPECT_EQ(gpt.info.blockSize, 16);
  EXPECT_EQ(gpt.info.vocabSize, 256);
}

TEST_F(TrainedModelTest, InfoSurvivesJson) {
  const serve::ModelInfo a = serve::loadTrainedModel(*shards_).info;
  const serve::ModelInfo b = serve::ModelInfo::fromJson(a.toJson(), "test");
  EXPECT_EQ(b.toJson(), a.toJson());
  const serve::ModelInfo g = serve::loadTrainedModel(*gpt_).info;
  EXPECT_EQ(serve::ModelInfo::fromJson(g.toJson(), "test").toJson(), g.toJson());
  nlohmann::json broken = a.toJson();
  broken.erase("classes");
  expectThrowsWith<DataError>([&] { serve::ModelInfo::fromJson(broken, "m.json"); },
                                    {"m.json", "classes"});
}

TEST_F(TrainedModelTest, PredictorTakesRawPixelsAndNormalizesThem) {
  const serve::TrainedModel m = serve::loadTrainedModel(*cnn_);
  auto predictor = serve::openPredictor(*cnn_);
  const at::Tensor raw = torch::randint(0, 256, {3, 1, 28, 28}).to(torch::kFloat);
  const at::Tensor expected = m.model->forward((raw / 255 - 0.3f) / 0.2f);
  const at::Tensor got = predictor->forward(raw);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-5));
  // One input alone gives the same answer as in a batch (eval BatchNorm).
  EXPECT_TRUE(torch::allclose(predictor->forward(raw.slice(0, 1, 2)), got.slice(0, 1, 2), 1e-5, 1e-5));
}

TEST_F(TrainedModelTest, ModelMayBeTheWeightsFileOrAJobGivenApart) {
  const at::Tensor raw = torch::full({1, 1, 28, 28}, 100.0f);
  const at::Tensor viaRun = serve::openPredictor(*cnn_)->forward(raw);
  EXPECT_TRUE(torch::equal(serve::openPredictor(*cnn_ + "/model/final.pt")->forward(raw), viaRun));
  const std::string loose = dir_->file("loose.pt");
  fs::copy_file(*cnn_ + "/model/final.pt", loose, fs::copy_options::overwrite_existing);
  expectThrowsWith<UsageError>([&] { serve::openPredictor(loose); }, {loose, "--job"});
  EXPECT_TRUE(torch::equal(serve::openPredictor(loose, *cnn_ + "/job.yaml")->forward(raw), viaRun));
  expectThrowsWith<UsageError>([&] { serve::openPredictor(dir_->file("missing")); },
                                     {"missing", "no such file"});
}

TEST_F(TrainedModelTest, WrongInputsAreRefusedByName) {
  auto cnn = serve::openPredictor(*cnn_);
  expectThrowsWith<DataError>([&] { cnn->forward(torch::zeros({2, 3, 28, 28})); },
                                    {"[batch, 1, 28, 28]", "[2, 3, 28, 28]"});
  expectThrowsWith<DataError>([&] { cnn->forward(torch::zeros({1, 28, 28})); }, {"[1, 28, 28]"});
  expectThrowsWith<DataError>([&] { cnn->forward(torch::zeros({1, 1, 28, 28}, torch::kLong)); },
                                    {"Long"});
  auto gpt = serve::openPredictor(*gpt_);
  EXPECT_EQ(gpt->forward(torch::zeros({2, 5}, torch::kLong)).sizes(), (std::vector<int64_t>{2, 5, 256}));
  expectThrowsWith<DataError>([&] { gpt->forward(torch::zeros({1, 17}, torch::kLong)); },
                                    {"17 tokens", "16"});
  expectThrowsWith<DataError>([&] { gpt->forward(torch::full({1, 3}, 256, torch::kLong)); },
                                    {"[0, 256)"});
  expectThrowsWith<DataError>([&] { gpt->forward(torch::zeros({1, 3})); }, {"int64"});
}

}  // namespace
}  // namespace cohort
