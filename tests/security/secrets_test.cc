// A whole job against blob storage (Azurite on loopback) with a SAS token
// inside its URLs, as a new user would write it: the token must appear in
// no output of any command and in no file cohort writes (run directory,
// checkpoints local and remote, the node cache), and what cohort writes is
// readable by its user only.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/storage/storage.h"
#include "test_paths.h"
#include "util/azurite.h"
#include "util/process.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using test::Azurite;
using test::TempDir;

test::SharedAzurite azurite;

class Secrets : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { azurite.start(); }
  static void TearDownTestSuite() { azurite.stop(); }
  void SetUp() override {
    ASSERT_NE(azurite.get(), nullptr) << azurite.error();
    ::unsetenv("AZURE_STORAGE_KEY");
    ::unsetenv("AZURE_STORAGE_SAS_TOKEN");
  }
  static std::string url(const std::string& path) { return azurite.get()->url(path); }
  static storage::StorageOptions keyOptions(const TempDir& dir) {
    storage::StorageOptions o;
    o.credentialsFile = dir.file("creds");
    test::writeText(o.credentialsFile, std::string("account_key = ") + Azurite::kKey + "\n");
    o.allowInsecure = true;
    return o;
  }
};

// Every place `needle` occurs in the files under `root`, as "path" lines.
std::vector<std::string> filesHolding(const std::string& root, const std::string& needle) {
  std::vector<std::string> hits;
  if (!fs::exists(root)) return hits;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().find(needle) != std::string::npos) hits.push_back(e.path().string());
  }
  return hits;
}

// Files and directories under `root` that others than the user may read.
std::vector<std::string> notPrivate(const std::string& root) {
  std::vector<std::string> out;
  auto check = [&](const fs::path& p) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || S_ISLNK(st.st_mode)) return;
    if ((st.st_mode & 077) != 0) out.push_back(p.string());
  };
  check(root);
  for (const auto& e : fs::recursive_directory_iterator(root)) check(e.path());
  return out;
}

TEST_F(Secrets, ASasTokenInTheJobsUrlsAppearsInNoOutputAndNoFile) {
  TempDir dir;
  const auto key = keyOptions(dir);
  // A dataset and a checkpoint container, made with the account key.
  const auto made = test::run({COHORT_PYTHON, std::string(COHORT_SOURCE_DIR) + "/scripts/make-imagenet-like.py",
                               dir.file("img"), "--classes", "2", "--per-class", "8", "--seed", "3"});
  ASSERT_EQ(made.exitCode, 0) << made.describe();
  const auto packed = test::run({COHORT_BIN, "data", "pack", dir.file("img"), url("secret-data/train"),
                                 "--shard-mb", "0.1", "--no-progress", "--allow-insecure"},
                                {{"AZURE_STORAGE_KEY", Azurite::kKey}});
  ASSERT_EQ(packed.exitCode, 0) << packed.describe();
  storage::createContainer(url("secret-ckpt"), key);

  // The job names both with a SAS token in the URL; no other credential.
  const std::string sas = test::accountSas(Azurite::kAccount, Azurite::kKey);
  const std::string sig = sas.substr(sas.find("sig=") + 4);
  ASSERT_GT(sig.size(), 20u);
  const std::string run = dir.file("run"), cache = dir.file("cache");
  const std::vector<std::string> sets = {
      "data.train.path=" + url("secret-data/train") + "?" + sas,
      "checkpoint.remote=" + url("secret-ckpt/job") + "?" + sas,
      "data.eval.kind=none", "data.train.crop_size=16", "data.cache.dir=" + cache,
      "storage.allow_insecure=true", "model.num_classes=2", "model.arch=simple_cnn",
      "training.epochs=2", "training.batch_size=4", "checkpoint.every_steps=1",
      "output.progress=off", "output.tensorboard=true", "output.timeline=true"};
  auto command = [&](std::vector<std::string> argv) {
    for (const auto& s : sets) {
      argv.push_back("--set");
      argv.push_back(s);
    }
    return argv;
  };
  const std::string example = std::string(COHORT_SOURCE_DIR) + "/examples/imagenet-style.yaml";
  std::vector<test::ProcessResult> outputs;
  outputs.push_back(test::run(command({COHORT_BIN, "validate", example})));
  ASSERT_EQ(outputs.back().exitCode, 0) << outputs.back().describe();
  // The redacted URL is still shown.
  EXPECT_NE(outputs.back().out.find(url("secret-ckpt/job")), std::string::npos) << outputs.back().out;
  outputs.push_back(test::run(command({COHORT_BIN, "run", example, "--run-dir", run, "--procs", "2"}),
                              {{"COHORT_LOG_LEVEL", "debug"}}, std::chrono::minutes(5)));
  ASSERT_EQ(outputs.back().exitCode, 0) << outputs.back().describe();
  // Run again: the finished run resumes from its checkpoint and reads job.yaml.
  outputs.push_back(test::run(command({COHORT_BIN, "run", example, "--run-dir", run, "--procs", "2"}),
                              {}, std::chrono::minutes(5)));
  ASSERT_EQ(outputs.back().exitCode, 0) << outputs.back().describe();
  outputs.push_back(test::run({COHORT_BIN, "logs", run}));
  EXPECT_EQ(outputs.back().exitCode, 0) << outputs.back().describe();

  // The job really used both URLs: checkpoints reached the remote tier and
  // shards the cache.
  auto remote = storage::openStorage(url("secret-ckpt/job"), key);
  const auto objects = remote->list("");
  bool manifests = false;
  for (const auto& o : objects) manifests = manifests || o.name.find("manifest.json") != std::string::npos;
  ASSERT_TRUE(manifests) << "no checkpoint reached " << url("secret-ckpt/job");
  ASSERT_TRUE(fs::exists(cache) && !fs::is_empty(cache));

  // The control: the search finds the token where it is.
  test::writeText(dir.file("control/args"), outputs.front().describe() + sets[0]);
  EXPECT_EQ(filesHolding(dir.file("control"), sig).size(), 1u);

  for (const auto& o : outputs) {
    EXPECT_EQ(o.out.find(sig), std::string::npos) << o.out;
    EXPECT_EQ(o.err.find(sig), std::string::npos) << o.err;
  }
  for (const std::string& root : {run, cache}) {
    EXPECT_EQ(filesHolding(root, sig), std::vector<std::string>{}) << root;
    EXPECT_EQ(notPrivate(root), std::vector<std::string>{}) << root;
  }
  for (const auto& o : objects) {
    EXPECT_EQ(remote->readRange(o.name, 0, o.size).find(sig), std::string::npos) << o.name;
  }
}

TEST_F(Secrets, RanksWithoutTheirCredentialsFailNamingTheUrlNotTheToken) {
  // job.yaml alone (as a rank reads it) lacks the token: a rank started
  // without `cohort run`'s hand-over says what credential is missing.
  TempDir dir;
  const std::string sas = test::accountSas(Azurite::kAccount, Azurite::kKey);
  const std::string job = dir.file("job.yaml");
  const auto v = test::run({COHORT_BIN, "validate", std::string(COHORT_SOURCE_DIR) + "/examples/fashion-mnist.yaml",
                            "--set", "checkpoint.remote=" + url("c/job") + "?" + sas});
  ASSERT_EQ(v.exitCode, 0) << v.describe();
  test::writeText(job, v.out);
  const auto again = test::run({COHORT_BIN, "validate", job});
  ASSERT_EQ(again.exitCode, 0) << again.describe();
  EXPECT_EQ(again.out, v.out);  // the redacted job loads and is stable
  // A malformed hand-over is refused without being quoted.
  const auto bad = test::run({COHORT_BIN, "worker", job, "--run-dir", dir.file("r")},
                             {{"COHORT_URL_CREDENTIALS", "not json sig=XYZSECRET"}});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_NE(bad.err.find("COHORT_URL_CREDENTIALS"), std::string::npos) << bad.describe();
  EXPECT_EQ(bad.err.find("XYZSECRET"), std::string::npos) << bad.describe();
}

}  // namespace
}  // namespace cohort
