// The trained model the deploy commands start from (serve/model.h): what
// loadTrainedModel learns from a run directory, the forms MODEL can take,
// the raw-pixel contract, and the inputs a Predictor refuses.

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

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

class TrainedModelTest : public test::DeployRunsTest {};

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

TEST_F(TrainedModelTest, AnExportInTheRunDirectoryIsOpenedAsTheExport) {
  // cohort export's default place: RUN/model/model.ts.pt, under RUN/job.yaml.
  const test::TempDir copy;
  const std::string run = copy.file("run");
  fs::copy(*shards_, run, fs::copy_options::recursive);
  const auto r = test::cohort({"export", run, "--format", "torchscript"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string ts = run + "/model/model.ts.pt";
  EXPECT_TRUE(serve::isScriptExport(ts));
  EXPECT_FALSE(serve::isScriptExport(run + "/model/final.pt"));
  EXPECT_FALSE(serve::isScriptExport(run + "/job.yaml"));
  const at::Tensor raw = torch::randint(0, 256, {2, 3, 32, 32}).to(torch::kFloat);
  auto exported = serve::openPredictor(ts);
  EXPECT_EQ(exported->info().classes, std::vector<std::string>({"blue", "green", "red"}));
  EXPECT_TRUE(torch::allclose(exported->forward(raw), serve::openPredictor(run)->forward(raw), 1e-4, 1e-4));
}

TEST_F(TrainedModelTest, EncodedImagesBecomeRawPixelsOrAreRefused) {
  const serve::ModelInfo info = serve::loadTrainedModel(*shards_).info;
  const std::string png = test::readText(*shards_ + "/../images/red/red-0.png");
  const at::Tensor pixels =
      serve::pixelsFromImage(reinterpret_cast<const uint8_t*>(png.data()), png.size(), info);
  EXPECT_EQ(pixels.sizes(), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_GT(pixels.max().item<float>(), 150.0f);  // raw 0..255, red channel of a red image
  EXPECT_LE(pixels.max().item<float>(), 255.0f);
  const std::string cut = png.substr(0, png.size() / 2);
  expectThrowsWith<DataError>(
      [&] { serve::pixelsFromImage(reinterpret_cast<const uint8_t*>(cut.data()), cut.size(), info); },
      {"does not decode"});
  // A PNG header claiming 9000 x 9000 px is refused before decoding.
  std::string big = png;
  const unsigned char dims[8] = {0, 0, 0x23, 0x28, 0, 0, 0x23, 0x28};
  big.replace(16, 8, reinterpret_cast<const char*>(dims), 8);
  const uint32_t crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(big.data() + 12), 17));
  for (int i = 0; i < 4; ++i) big[static_cast<size_t>(29 + i)] = static_cast<char>((crc >> (24 - 8 * i)) & 0xff);
  expectThrowsWith<DataError>(
      [&] { serve::pixelsFromImage(reinterpret_cast<const uint8_t*>(big.data()), big.size(), info); },
      {"9000x9000", "larger"});
  const serve::ModelInfo gpt = serve::loadTrainedModel(*gpt_).info;
  expectThrowsWith<DataError>(
      [&] { serve::pixelsFromImage(reinterpret_cast<const uint8_t*>(png.data()), png.size(), gpt); },
      {"tokens"});
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
