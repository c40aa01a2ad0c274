// `cohort score`: real rank processes over image folders, IDX files, shards
// and token data; --procs 2 equal to --procs 1 and to the Predictor on each
// sample alone; a run killed mid-way and resumed equal to an uninterrupted
// one; a hung rank stopped by the stall watch; blob URLs (Azurite); refused
// reruns; undecodable images and bad input.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "cohort/data/image.h"
#include "cohort/serve/model.h"
#include "cohort/serve/score.h"
#include "serve/detail/score_run.h"
#include "util/azurite.h"
#include "util/deploy.h"
#include "util/jobs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ScoreTest : public test::DeployRunsTest {
 protected:
  static void SetUpTestSuite() {
    DeployRunsTest::SetUpTestSuite();
    images_ = new std::string(test::makeImageFolder(dir_->file("images"), 3));  // 18 images
  }
  static void TearDownTestSuite() {
    delete images_;
    DeployRunsTest::TearDownTestSuite();
  }

  // Every process a test starts carries this marker, to find any left behind.
  void SetUp() override {
    std::random_device rd;
    tag_ = std::to_string(getpid()) + "-" + std::to_string(rd());
  }
  void TearDown() override { EXPECT_TRUE(test::processesWithEnv("COHORT_TEST_TAG=" + tag_).empty()); }

  test::ProcessResult score(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    args.insert(args.begin(), "score");
    env["COHORT_TEST_TAG"] = tag_;
    return test::cohort(args, env);
  }
  static json summaryOf(const std::string& out) {
    return json::parse(test::readText(out + ".run/summary.json"));
  }

  static std::string* images_;
  test::TempDir tmp_;
  std::string tag_;
};
std::string* ScoreTest::images_ = nullptr;

// The top-k of one sample's logits, as score writes them.
void expectTopMatches(const json& top, const at::Tensor& logits, const serve::ModelInfo& info,
                      const std::string& what) {
  const at::Tensor probs = torch::softmax(logits.to(torch::kFloat), 0);
  const auto [values, labels] = probs.topk(static_cast<int64_t>(top.size()));
  ASSERT_EQ(static_cast<int64_t>(top.size()), std::min<int64_t>(5, info.numClasses)) << what;
  for (size_t k = 0; k < top.size(); ++k) {
    const int64_t label = labels[static_cast<int64_t>(k)].item<int64_t>();
    EXPECT_EQ(top[k]["label"].get<int64_t>(), label) << what << " rank " << k;
    EXPECT_EQ(top[k]["name"].get<std::string>(), info.className(label)) << what;
    EXPECT_NEAR(top[k]["probability"].get<double>(), values[static_cast<int64_t>(k)].item<float>(), 1e-5)
        << what;
  }
}


TEST_F(ScoreTest, ImageFolderTwoProcsEqualOneAndThePredictorOnEachImage) {
  const std::string one = tmp_.file("one.jsonl"), two = tmp_.file("two.jsonl");
  const auto r1 = score({*shards_, "--data", *images_, "--out", one, "--procs", "1", "--batch-size", "4"});
  ASSERT_EQ(r1.exitCode, 0) << r1.describe();
  const auto r2 = score({*shards_, "--data", *images_, "--out", two, "--procs", "2", "--batch-size", "4"});
  ASSERT_EQ(r2.exitCode, 0) << r2.describe();
  EXPECT_EQ(test::readText(one), test::readText(two));

  const auto lines = test::readJsonLines(two);
  ASSERT_EQ(lines.size(), 18u);
  const auto predictor = serve::openPredictor(*shards_);
  const serve::ModelInfo& info = predictor->info();
  data::ImageTransform t;
  t.outHeight = info.height;
  t.outWidth = info.width;
  t.channels = info.channels;
  t.resizeShorter = info.resize;
  std::string previous;
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& l = lines[i];
    EXPECT_EQ(l["index"].get<size_t>(), i);
    const std::string id = l["id"].get<std::string>();
    EXPECT_LT(previous, id);  // sorted by relative path
    previous = id;
    const std::string folder = id.substr(0, id.find('/'));
    EXPECT_EQ(info.className(l["label"].get<int64_t>()), folder) << id;
    const std::string bytes = test::readText(*images_ + "/" + id);
    at::Tensor pixels = torch::empty({1, info.channels, info.height, info.width});
    data::decodeImage(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), t, 0,
                      pixels.data_ptr<float>());
    expectTopMatches(l["top"], predictor->forward(pixels * 255.0f)[0], info, id);
  }
  const json s = summaryOf(two);
  EXPECT_EQ(s["samples"], 18);
  EXPECT_EQ(s["resumed"], 0);
  EXPECT_EQ(s["procs"], 2);
  EXPECT_EQ(s["batch_size"], 4);
  EXPECT_GT(s["samples_per_s"].get<double>(), 0);
  EXPECT_FALSE(fs::exists(two + ".run/part-0.jsonl"));  // merged, then removed
}

// An IDX file written here (the cnn takes 1x28x28), with and without the
// labels file beside it.
TEST_F(ScoreTest, IdxImagesWithTheirLabels) {
  const int64_t n = 7;
  std::string images = {0, 0, 8, 3, 0, 0, 0, static_cast<char>(n), 0, 0, 0, 28, 0, 0, 0, 28};
  std::string labels = {0, 0, 8, 1, 0, 0, 0, static_cast<char>(n)};
  std::mt19937 rng(5);
  for (int64_t i = 0; i < n * 28 * 28; ++i) images += static_cast<char>(rng() % 256);
  for (int64_t i = 0; i < n; ++i) labels += static_cast<char>(i % 4);
  fs::create_directories(tmp_.file("mnist"));
  const std::string imagesPath = tmp_.file("mnist/t10k-images-idx3-ubyte");
  test::writeText(imagesPath, images);
  test::writeText(tmp_.file("mnist/t10k-labels-idx1-ubyte"), labels);

  const std::string out = tmp_.file("idx.jsonl");
  const auto r = score({*cnn_, "--data", imagesPath, "--out", out, "--procs", "2", "--batch-size", "3"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto lines = test::readJsonLines(out);
  ASSERT_EQ(lines.size(), static_cast<size_t>(n));
  const auto predictor = serve::openPredictor(*cnn_);
  for (int64_t i = 0; i < n; ++i) {
    const json& l = lines[static_cast<size_t>(i)];
    EXPECT_EQ(l["id"], i);
    EXPECT_EQ(l["label"], i % 4);
    at::Tensor pixels = torch::empty({1, 1, 28, 28});
    for (int64_t k = 0; k < 28 * 28; ++k) {
      pixels.data_ptr<float>()[k] = static_cast<uint8_t>(images[static_cast<size_t>(16 + i * 784 + k)]);
    }
    expectTopMatches(l["top"], predictor->forward(pixels)[0], predictor->info(), "sample " + std::to_string(i));
  }

  fs::remove(tmp_.file("mnist/t10k-labels-idx1-ubyte"));
  const std::string unlabelled = tmp_.file("unlabelled.jsonl");
  const auto u = score({*cnn_, "--data", imagesPath, "--out", unlabelled});
  ASSERT_EQ(u.exitCode, 0) << u.describe();
  for (const json& l : test::readJsonLines(unlabelled)) EXPECT_FALSE(l.contains("label")) << l;
}

// The packed shards the model trained on, directly and through a YAML
// dataset section: each record predicted as its image file is.
TEST_F(ScoreTest, ShardsAndADatasetSection) {
  const std::string shardsDir = fs::path(*shards_).parent_path().string() + "/shards";
  const std::string out = tmp_.file("shards.jsonl");
  const auto r = score({*shards_, "--data", shardsDir, "--out", out, "--procs", "2", "--batch-size", "5"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto lines = test::readJsonLines(out);
  ASSERT_EQ(lines.size(), 24u);  // 4 JPEG + 4 PNG per class
  const auto predictor = serve::openPredictor(*shards_);
  const serve::ModelInfo& info = predictor->info();
  const std::string images = fs::path(*shards_).parent_path().string() + "/images";
  data::ImageTransform t;
  t.outHeight = info.height;
  t.outWidth = info.width;
  t.resizeShorter = info.resize;
  for (const json& l : lines) {
    const std::string id = l["id"].get<std::string>();  // the record's key: its path when packed
    EXPECT_EQ(info.className(l["label"].get<int64_t>()), id.substr(0, id.find('/'))) << id;
    const std::string bytes = test::readText(images + "/" + id);
    at::Tensor pixels = torch::empty({1, 3, info.height, info.width});
    data::decodeImage(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), t, 0,
                      pixels.data_ptr<float>());
    expectTopMatches(l["top"], predictor->forward(pixels * 255.0f)[0], info, id);
  }

  const std::string section = tmp_.file("val.yaml");
  test::writeText(section, "kind: shards\npath: " + shardsDir + "\nlimit: 5\n");
  const std::string limited = tmp_.file("limited.jsonl");
  const auto y = score({*shards_, "--data", section, "--out", limited});
  ASSERT_EQ(y.exitCode, 0) << y.describe();
  const auto five = test::readJsonLines(limited);
  ASSERT_EQ(five.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(five[i], lines[i]);

  // The schema's checks, located in the section's own file.
  test::writeText(section, "kind: shards\npath: " + shardsDir + "\nlimt: 5\n");
  const auto bad = score({*shards_, "--data", section, "--out", tmp_.file("bad.jsonl")});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_NE(bad.err.find(section + ":3:1: unknown key 'limt'"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("did you mean 'limit'"), std::string::npos) << bad.err;
}

// The same shards packed to blob storage (Azurite on loopback): two ranks
// read them with the storage flags `cohort score` was given and write what
// the local shards give; the account key is in no output. Plain http
// without --allow-insecure is refused before any rank starts.
TEST_F(ScoreTest, ShardsOnBlobStorage) {
  test::Azurite azurite;
  const std::string url = azurite.url("scoring/shards");
  const std::map<std::string, std::string> key{{"AZURE_STORAGE_KEY", test::Azurite::kKey}};
  const std::string base = fs::path(*shards_).parent_path().string();
  const auto packed = test::cohort({"data", "pack", base + "/images", url, "--no-progress", "--allow-insecure"}, key);
  ASSERT_EQ(packed.exitCode, 0) << packed.describe();

  const std::string local = tmp_.file("local.jsonl");
  ASSERT_EQ(score({*shards_, "--data", base + "/shards", "--out", local, "--batch-size", "5"}).exitCode, 0);
  const std::string remote = tmp_.file("blob.jsonl");
  const auto r = score({*shards_, "--data", url, "--out", remote, "--procs", "2", "--batch-size", "5",
                        "--allow-insecure"},
                       key);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto lines = test::readJsonLines(remote);
  ASSERT_EQ(lines.size(), 24u);
  EXPECT_EQ(lines, test::readJsonLines(local));
  EXPECT_EQ(r.out.find(test::Azurite::kKey), std::string::npos);
  EXPECT_EQ(r.err.find(test::Azurite::kKey), std::string::npos);
  for (const auto& e : fs::recursive_directory_iterator(remote + ".run")) {
    if (e.is_regular_file()) {
      EXPECT_EQ(test::readText(e.path().string()).find(test::Azurite::kKey), std::string::npos) << e.path();
    }
  }

  // The same dataset as az://account/..., reached through --endpoint with
  // the key in a --credentials-file only: the ranks must be given both.
  const std::string creds = tmp_.file("creds");
  test::writeText(creds, std::string("account_key = ") + test::Azurite::kKey + "\n");
  ::chmod(creds.c_str(), 0600);
  const std::string viaFile = tmp_.file("az.jsonl");
  const auto az = score({*shards_, "--data", std::string("az://") + test::Azurite::kAccount + "/scoring/shards",
                         "--out", viaFile, "--procs", "2", "--batch-size", "5", "--endpoint", azurite.endpoint(),
                         "--credentials-file", creds, "--allow-insecure"});
  ASSERT_EQ(az.exitCode, 0) << az.describe();
  EXPECT_EQ(test::readJsonLines(viaFile), lines);

  const std::string refusedOut = tmp_.file("refused.jsonl");
  const auto refused = score({*shards_, "--data", url, "--out", refusedOut}, key);
  EXPECT_EQ(refused.exitCode, 2) << refused.describe();
  EXPECT_NE(refused.err.find("plain http is allowed only"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(refusedOut));

  // A SAS token in the URL would land in OUT.run/ and the ranks' command
  // lines: refused, without repeating it.
  const auto sas = score({*shards_, "--data", url + "?sv=2021&sig=SECRETSIG", "--out", refusedOut,
                          "--allow-insecure"});
  EXPECT_EQ(sas.exitCode, 2) << sas.describe();
  EXPECT_NE(sas.err.find("--credentials-file (sas = ...)"), std::string::npos) << sas.err;
  EXPECT_EQ(sas.err.find("SECRETSIG"), std::string::npos) << sas.err;
  EXPECT_FALSE(fs::exists(refusedOut + ".run"));
}

TEST_F(ScoreTest, TokenWindowsWithTheirLoss) {
  const std::string tokens = fs::path(*gpt_).parent_path().string() + "/tok/val";
  const std::string out = tmp_.file("tokens.jsonl");
  const auto r = score({*gpt_, "--data", tokens, "--out", out, "--procs", "2", "--batch-size", "3"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto lines = test::readJsonLines(out);
  const auto predictor = serve::openPredictor(*gpt_);
  const int64_t block = predictor->info().blockSize;
  DatasetConfig d;
  d.kind = DataKind::tokens;
  d.path = tokens;
  data::OpenOptions o;
  o.tokenWindow = block + 1;
  const auto windows = data::openTokens(d, o);
  ASSERT_EQ(static_cast<int64_t>(lines.size()), windows->size());
  ASSERT_GE(lines.size(), 2u);
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& l = lines[i];
    EXPECT_EQ(l["index"], i);
    EXPECT_EQ(l["id"], static_cast<int64_t>(i) * block);
    EXPECT_EQ(l["tokens"], block);
    at::Tensor w = torch::empty({1, block + 1}, torch::kLong);
    windows->readTokens(static_cast<int64_t>(i), w.data_ptr<int64_t>(), 0);
    const at::Tensor logits = predictor->forward(w.narrow(1, 0, block).contiguous())[0];
    const double loss = torch::nn::functional::cross_entropy(logits, w[0].narrow(0, 1, block)).item<double>();
    EXPECT_NEAR(l["loss"].get<double>(), loss, 1e-4) << i;
    EXPECT_NEAR(l["perplexity"].get<double>(), std::exp(loss), 1e-3 * std::exp(loss)) << i;
  }
}

// Rank 1 killed after its first batch (COHORT_FAULT), a torn line added to
// its part, then a rerun: the same OUT as an uninterrupted run.
TEST_F(ScoreTest, AKilledRunResumesToTheSameOutput) {
  const std::string whole = tmp_.file("whole.jsonl"), out = tmp_.file("resumed.jsonl");
  const std::vector<std::string> options = {"--procs", "2", "--batch-size", "2", "--top-k", "2"};
  auto args = [&](const std::string& o) {
    std::vector<std::string> a = {*shards_, "--data", *images_, "--out", o};
    a.insert(a.end(), options.begin(), options.end());
    return a;
  };
  const auto w = score(args(whole));
  ASSERT_EQ(w.exitCode, 0) << w.describe();

  const auto killed = score(args(out), {{"COHORT_FAULT", "kill@rank1:step1"}});
  EXPECT_EQ(killed.exitCode, 1) << killed.describe();
  EXPECT_NE(killed.err.find("rank 1 was killed by signal 9"), std::string::npos) << killed.err;
  EXPECT_NE(killed.err.find(out + ".run/rank-1.log"), std::string::npos) << killed.err;
  EXPECT_FALSE(fs::exists(out));
  const std::string part = out + ".run/part-1.jsonl";
  ASSERT_EQ(test::readJsonLines(part).size(), 2u);  // its first batch
  std::ofstream(part, std::ios::app) << R"({"index":10,"id":"gre)";  // a torn line

  const auto resumed = score(args(out));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.describe();
  EXPECT_EQ(test::readText(out), test::readText(whole));
  const json s = summaryOf(out);
  EXPECT_GE(s["resumed"].get<int64_t>(), 2);
  EXPECT_EQ(s["scored"].get<int64_t>() + s["resumed"].get<int64_t>(), 18);

  const auto again = score(args(out));
  EXPECT_EQ(again.exitCode, 0) << again.describe();
  EXPECT_NE(again.out.find("is complete"), std::string::npos) << again.describe();
}

// Rank 1 hangs after its first batch (COHORT_FAULT sleep): the stall watch
// stops every rank, names the hung one and its log, exits 1; the rerun
// (--stall-seconds is not part of what a rerun must match) completes it.
TEST_F(ScoreTest, AHungRankIsStoppedByTheStallWatchAndTheRerunCompletes) {
  const std::string out = tmp_.file("hung.jsonl");
  std::vector<std::string> args = {*shards_, "--data", *images_, "--out", out, "--procs", "2", "--batch-size", "2"};
  std::vector<std::string> watched = args;
  for (const char* a : {"--stall-seconds", "15"}) watched.push_back(a);
  const auto hung = score(watched, {{"COHORT_FAULT", "sleep3600@rank1:step1"}});
  EXPECT_EQ(hung.exitCode, 1) << hung.describe();
  EXPECT_NE(hung.err.find("rank 1 scored nothing for 15 s (--stall-seconds"), std::string::npos) << hung.err;
  EXPECT_NE(hung.err.find(out + ".run/rank-1.log"), std::string::npos) << hung.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(test::readJsonLines(out + ".run/part-1.jsonl").size(), 2u);  // its first batch

  const auto rerun = score(args);
  ASSERT_EQ(rerun.exitCode, 0) << rerun.describe();
  EXPECT_EQ(test::readJsonLines(out).size(), 18u);
  EXPECT_GE(summaryOf(out)["resumed"].get<int64_t>(), 2);

  const auto bad = score({*shards_, "--data", *images_, "--out", tmp_.file("bad.jsonl"), "--stall-seconds", "-1"});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
}

// A rerun with another --batch-size is refused before it touches the parts
// (their boundaries are multiples of the recorded one); the same command
// then resumes to the uninterrupted output. Once complete, any batch size
// reads "complete".
TEST_F(ScoreTest, AResumeWithAnotherBatchSizeIsRefused) {
  const std::string whole = tmp_.file("whole.jsonl"), out = tmp_.file("resumed.jsonl");
  auto args = [&](const std::string& o, const std::string& batch) {
    return std::vector<std::string>{*shards_, "--data",  *images_,      "--out", o,
                                    "--procs", "2",      "--batch-size", batch};
  };
  const auto w = score(args(whole, "2"));
  ASSERT_EQ(w.exitCode, 0) << w.describe();

  const auto killed = score(args(out, "2"), {{"COHORT_FAULT", "kill@rank1:step1"}});
  ASSERT_EQ(killed.exitCode, 1) << killed.describe();
  const std::string part = out + ".run/part-1.jsonl";
  const std::string scored = test::readText(part);
  ASSERT_EQ(test::readJsonLines(part).size(), 2u);  // its first batch: samples 8 and 9

  // 18 samples in batches of 2 are parts [0, 8) and [8, 18); in batches of 6
  // they would be [0, 6) and [6, 18).
  const auto changed = score(args(out, "6"));
  EXPECT_EQ(changed.exitCode, 2) << changed.describe();
  EXPECT_NE(changed.err.find("--batch-size was 2, now 6"), std::string::npos) << changed.err;
  EXPECT_EQ(test::readText(part), scored);
  EXPECT_FALSE(fs::exists(out));
  const json record = json::parse(test::readText(out + ".run/score.json"));
  EXPECT_EQ(record["batch_size"], 2);
  EXPECT_EQ(record["parts"], json::parse("[[0, 8], [8, 18]]"));

  const auto resumed = score(args(out, "2"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.describe();
  EXPECT_EQ(test::readText(out), test::readText(whole));
  EXPECT_EQ(summaryOf(out)["batch_size"], 2);
  EXPECT_GE(summaryOf(out)["resumed"].get<int64_t>(), 2);

  const auto complete = score(args(out, "6"));
  EXPECT_EQ(complete.exitCode, 0) << complete.describe();
  EXPECT_NE(complete.out.find("is complete"), std::string::npos) << complete.describe();
}

// A TorchScript export as MODEL (`cohort export RUN --format torchscript`)
// scores as its run does; replacing the export is a change of the model even
// when the weights file it was exported from is unchanged.
TEST_F(ScoreTest, ATorchScriptExportScoresAsItsRun) {
  const std::string run = tmp_.file("run");
  fs::copy(*shards_, run, fs::copy_options::recursive);
  const auto e = test::cohort({"export", run, "--format", "torchscript"});
  ASSERT_EQ(e.exitCode, 0) << e.describe();
  const std::string exported = run + "/model/model.ts.pt";
  ASSERT_TRUE(serve::isScriptExport(exported));

  const std::string fromRun = tmp_.file("run.jsonl"), fromExport = tmp_.file("export.jsonl");
  const auto r = score({run, "--data", *images_, "--out", fromRun, "--procs", "2", "--batch-size", "4"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto x = score({exported, "--data", *images_, "--out", fromExport, "--procs", "2", "--batch-size", "4"});
  ASSERT_EQ(x.exitCode, 0) << x.describe();
  const auto a = test::readJsonLines(fromRun), b = test::readJsonLines(fromExport);
  ASSERT_EQ(a.size(), 18u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["index"], a[i]["index"]);
    EXPECT_EQ(b[i]["id"], a[i]["id"]);
    EXPECT_EQ(b[i]["label"], a[i]["label"]);
    ASSERT_EQ(b[i]["top"].size(), a[i]["top"].size()) << a[i];
    for (size_t k = 0; k < a[i]["top"].size(); ++k) {
      EXPECT_EQ(b[i]["top"][k]["label"], a[i]["top"][k]["label"]) << a[i]["id"] << " rank " << k;
      EXPECT_EQ(b[i]["top"][k]["name"], a[i]["top"][k]["name"]);
      // The run computes channels-last, the export contiguous: the same
      // function, float rounding apart.
      EXPECT_NEAR(b[i]["top"][k]["probability"].get<double>(), a[i]["top"][k]["probability"].get<double>(),
                  1e-5)
          << a[i]["id"];
    }
  }

  // Another export (other weights) in place of the first, and the run's
  // final.pt as it was: the export's record of where its weights came from
  // is the same file, unchanged.
  const std::string finalPt = run + "/model/final.pt";
  const std::string original = test::readText(finalPt);
  ckpt::StateDict weights = ckpt::readStateDict(finalPt);
  for (auto& [name, t] : weights) {
    if (t.is_floating_point()) t = t * 1.5;
  }
  ckpt::saveStateDict(weights, finalPt);
  const auto again = test::cohort({"export", run, "--format", "torchscript"});
  ASSERT_EQ(again.exitCode, 0) << again.describe();
  test::writeText(finalPt, original);
  const auto replaced =
      score({exported, "--data", *images_, "--out", fromExport, "--procs", "2", "--batch-size", "4"});
  EXPECT_EQ(replaced.exitCode, 2) << replaced.describe();
  EXPECT_NE(replaced.err.find("the weights of " + exported + " changed"), std::string::npos) << replaced.err;
}

// A rerun with other weights, another model or other data is refused (exit 2).
TEST_F(ScoreTest, ARerunWithAnotherModelIsRefused) {
  const std::string run = tmp_.file("run");
  fs::copy(*shards_, run, fs::copy_options::recursive);
  const std::string out = tmp_.file("p.jsonl");
  const auto first = score({run, "--data", *images_, "--out", out});
  ASSERT_EQ(first.exitCode, 0) << first.describe();

  ckpt::StateDict weights = ckpt::readStateDict(run + "/model/final.pt");
  for (auto& [name, t] : weights) {
    if (t.is_floating_point()) t = t * 1.5;
  }
  ckpt::saveStateDict(weights, run + "/model/final.pt");
  const auto changed = score({run, "--data", *images_, "--out", out});
  EXPECT_EQ(changed.exitCode, 2) << changed.describe();
  EXPECT_NE(changed.err.find("the weights of " + run + " changed"), std::string::npos) << changed.err;

  // Part-way through: killed, then rerun with another run directory.
  const std::string partial = tmp_.file("partial.jsonl");
  const auto killed = score({run, "--data", *images_, "--out", partial, "--procs", "2", "--batch-size", "2"},
                            {{"COHORT_FAULT", "exit7@rank0:step1"}});
  EXPECT_EQ(killed.exitCode, 1) << killed.describe();
  EXPECT_NE(killed.err.find("rank 0 exited with code 7"), std::string::npos) << killed.err;
  const auto other = score({*shards_, "--data", *images_, "--out", partial, "--procs", "2", "--batch-size", "2"});
  EXPECT_EQ(other.exitCode, 2) << other.describe();
  EXPECT_NE(other.err.find("the model was " + run), std::string::npos) << other.err;
  const std::string shardsDir = fs::path(*shards_).parent_path().string() + "/shards";
  const auto data = score({run, "--data", shardsDir, "--out", partial, "--procs", "2", "--batch-size", "2"});
  EXPECT_EQ(data.exitCode, 2) << data.describe();
  EXPECT_NE(data.err.find("the data was " + *images_), std::string::npos) << data.err;
  EXPECT_FALSE(fs::exists(partial));
}

// An image that does not decode gets a line with its error (the file named)
// instead of predictions; the others are scored.
TEST_F(ScoreTest, AnUndecodableImageGetsAnErrorLine) {
  const std::string images = tmp_.file("images");
  fs::copy(*images_, images, fs::copy_options::recursive);
  test::writeText(images + "/green/broken.jpg", "not a JPEG at all");
  const std::string out = tmp_.file("p.jsonl");
  const auto r = score({*shards_, "--data", images, "--out", out, "--procs", "2", "--batch-size", "4"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto lines = test::readJsonLines(out);
  ASSERT_EQ(lines.size(), 19u);
  int errors = 0;
  for (const json& l : lines) {
    if (l["id"] != "green/broken.jpg") {
      EXPECT_TRUE(l.contains("top")) << l;
      continue;
    }
    ++errors;
    EXPECT_FALSE(l.contains("top"));
    EXPECT_NE(l["error"].get<std::string>().find(images + "/green/broken.jpg"), std::string::npos) << l;
    EXPECT_NE(l["error"].get<std::string>().find("not a JPEG or PNG image"), std::string::npos) << l;
  }
  EXPECT_EQ(errors, 1);
  EXPECT_EQ(summaryOf(out)["errors"], 1);
}

uint32_t crc32(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (const char ch : bytes) {
    c ^= static_cast<uint8_t>(ch);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

std::string pngChunk(const std::string& type, const std::string& data) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
  };
  return be32(static_cast<uint32_t>(data.size())) + type + data + be32(crc32(type + data));
}

// A PNG whose header says 10000 x 10000 px (100 Mpx, over serve's 64 Mpx
// limit, under the data layer's own) is refused by its header, before any
// decoding, as serve refuses it: an error line naming the limit.
TEST_F(ScoreTest, AnImageOverTheLimitIsRefusedByItsHeader) {
  const std::string images = tmp_.file("images");
  fs::copy(*images_, images, fs::copy_options::recursive);
  const std::string ihdr = {0, 0, 0x27, 0x10, 0, 0, 0x27, 0x10, 8, 0, 0, 0, 0};  // 10000 x 10000 gray
  test::writeText(images + "/red/huge.png", std::string("\x89PNG\r\n\x1a\n", 8) + pngChunk("IHDR", ihdr) +
                                                 pngChunk("IDAT", std::string(16, 'x')) + pngChunk("IEND", ""));
  const std::string out = tmp_.file("p.jsonl");
  const auto r = score({*shards_, "--data", images, "--out", out, "--batch-size", "4"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  int errors = 0;
  for (const json& l : test::readJsonLines(out)) {
    if (l["id"] != "red/huge.png") continue;
    ++errors;
    EXPECT_NE(l["error"].get<std::string>().find("10000x10000 px is larger than cohort decodes (64 Mpx)"),
              std::string::npos)
        << l;
  }
  EXPECT_EQ(errors, 1);
}

// A part line whose index is not an integer is not a prediction of that
// sample: a DataError naming the part, not a JSON library exception.
TEST_F(ScoreTest, MergingAPartWithANonIntegerIndexIsADataError) {
  serve::detail::ScorePaths paths{tmp_.file("p.jsonl")};
  fs::create_directories(paths.dir());
  serve::detail::ScoreRecord record;
  record.samples = 2;
  record.procs = 1;
  record.batchSize = 2;
  record.parts = {{0, 2}};
  test::writeText(paths.part(0), "{\"index\": 0, \"id\": \"a\"}\n{\"index\": \"1\", \"id\": \"b\"}\n");
  try {
    serve::detail::mergeParts(paths, record);
    ADD_FAILURE() << "merged";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(paths.part(0) + ": holds 1 of the 2 predictions"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(paths.out));
}

// scoreCommand is a function: the lock on OUT.run is released when it
// returns (here by throwing after taking it: a part it cannot read), so a
// second call in the same process gets as far again.
TEST_F(ScoreTest, TheLockIsReleasedWhenScoreCommandReturns) {
  const std::string out = tmp_.file("p.jsonl");
  const auto first = score({*shards_, "--data", *images_, "--out", out});
  ASSERT_EQ(first.exitCode, 0) << first.describe();
  fs::remove(out);  // score.json stays: a rerun resumes
  fs::create_directories(out + ".run/part-0.jsonl");
  serve::ScoreOptions o;
  o.model = *shards_;
  o.data = *images_;
  o.out = out;
  for (int call = 1; call <= 2; ++call) {
    try {
      serve::scoreCommand(o);
      ADD_FAILURE() << "call " << call << " returned";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(out + ".run/part-0.jsonl"), std::string::npos) << e.what();
    } catch (const Error& e) {
      ADD_FAILURE() << "call " << call << ": " << e.what();
    }
    const int lock = ::open((out + ".run/lock").c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(lock, 0);
    EXPECT_EQ(::flock(lock, LOCK_EX | LOCK_NB), 0) << "call " << call << " left " << out << ".run/lock locked";
    ::close(lock);
  }
}

TEST_F(ScoreTest, BadInputIsNamedWithExitCodeTwo) {
  const std::string out = tmp_.file("p.jsonl");
  auto expectRefused = [&](std::vector<std::string> args, const std::string& part) {
    const auto r = score(args);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.err.find(part), std::string::npos) << r.describe();
  };
  expectRefused({tmp_.file("nothing"), "--data", *images_, "--out", out}, tmp_.file("nothing") + ": no such file");
  expectRefused({*shards_, "--data", tmp_.file("nothing"), "--out", out}, "--data " + tmp_.file("nothing"));
  expectRefused({*gpt_, "--data", *images_, "--out", out}, "the model is a language model");
  test::writeText(tmp_.file("file"), "x");
  expectRefused({*shards_, "--data", *images_, "--out", tmp_.file("file") + "/p.jsonl"}, "cannot create");
  fs::create_directories(tmp_.file("dir"));
  expectRefused({*shards_, "--data", *images_, "--out", tmp_.file("dir")}, "is a directory");
  test::writeText(tmp_.file("taken.jsonl"), "someone's file\n");
  expectRefused({*shards_, "--data", *images_, "--out", tmp_.file("taken.jsonl")}, "remove it or choose");
  EXPECT_EQ(test::readText(tmp_.file("taken.jsonl")), "someone's file\n");
  // Another command scoring into the same OUT holds its lock.
  fs::create_directories(tmp_.file("locked.jsonl.run"));
  const int lock = ::open(tmp_.file("locked.jsonl.run/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_EQ(::flock(lock, LOCK_EX | LOCK_NB), 0);
  expectRefused({*shards_, "--data", *images_, "--out", tmp_.file("locked.jsonl")}, "another `cohort score`");
  ::close(lock);
}

}  // namespace
}  // namespace cohort
