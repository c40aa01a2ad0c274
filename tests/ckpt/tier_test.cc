// Remote checkpoint tiers: a directory and blob storage (Azurite), through
// the same RemoteTier interface the checkpoint writer and resume use.

#include "cohort/ckpt/tier.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/core/time.h"
#include "util/azurite.h"
#include "util/process.h"

namespace cohort::ckpt {
namespace {

using test::Azurite;
using test::TempDir;

// A committed checkpoint of `step` in <parent>/step-<step>: two files and
// the manifest naming them.
std::string makeCheckpoint(const std::string& parent, int64_t step) {
  const std::string dir = parent + "/" + checkpointDirName(step);
  Manifest m;
  m.step = step;
  m.worldSize = 2;
  m.created = utcNow();
  for (const auto& [name, content] : std::vector<std::pair<std::string, std::string>>{
           {"model.bin", std::string(5000 + step, 'm')},
           {"rank-1.bin", "rank one at step " + std::to_string(step)}}) {
    test::writeText(dir + "/" + name, content);
    ManifestFile f;
    f.name = name;
    f.size = content.size();
    f.checksum = checksumFile(dir + "/" + name);
    m.files.push_back(f);
  }
  writeManifest(dir, m);
  return dir;
}

// Upload two checkpoints, list, download the newest, remove the oldest.
void roundTrip(RemoteTier& tier) {
  TempDir local;
  const std::string five = makeCheckpoint(local.path(), 5);
  const std::string twelve = makeCheckpoint(local.path(), 12);
  EXPECT_TRUE(tier.list().empty());
  tier.upload(five, readManifest(five));
  tier.upload(twelve, readManifest(twelve));
  tier.upload(twelve, readManifest(twelve));  // again: replaces it
  EXPECT_EQ(tier.list(), (std::vector<int64_t>{5, 12}));

  TempDir restored;
  const std::string into = restored.path() + "/checkpoints/step-12";
  tier.download(12, into);
  const Verification v = verifyCheckpoint(into, /*checksums=*/true);
  EXPECT_TRUE(v.valid) << v.problem;
  EXPECT_EQ(test::readText(into + "/rank-1.bin"), "rank one at step 12");
  EXPECT_EQ(readManifest(into).step, 12);
  for (const auto& e : std::filesystem::recursive_directory_iterator(into)) {
    EXPECT_NE(e.path().extension(), ".partial") << "left behind: " << e.path();
  }

  tier.remove(5);
  EXPECT_EQ(tier.list(), (std::vector<int64_t>{12}));
}

TEST(DirectoryTier, RoundTrip) {
  TempDir remote;
  auto tier = openTier(remote.path() + "/run", storage::StorageOptions{});
  roundTrip(*tier);
  EXPECT_FALSE(std::filesystem::exists(remote.path() + "/run/step-5"));
}

TEST(OpenTier, RejectsUnknownSchemesAndMissingCredentials) {
  unsetenv("AZURE_STORAGE_KEY");
  unsetenv("AZURE_STORAGE_SAS_TOKEN");
  EXPECT_THROW(openTier("s3://bucket/ckpt", storage::StorageOptions{}), ConfigError);
  try {
    openTier("az://acct/container/ckpt", storage::StorageOptions{});
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("AZURE_STORAGE_KEY"), std::string::npos) << e.what();
  }
}

class BlobTierTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { shared_.start(); }
  static void TearDownTestSuite() { shared_.stop(); }
  void SetUp() override {
    azurite_ = shared_.get();
    ASSERT_NE(azurite_, nullptr) << shared_.error();
    options_.credentialsFile = creds_.file("creds");
    test::writeText(options_.credentialsFile, std::string("account_key = ") + Azurite::kKey + "\n");
    options_.allowInsecure = true;
    options_.blockBytes = 4096;  // model.bin takes two blocks
  }
  static test::SharedAzurite shared_;
  Azurite* azurite_ = nullptr;
  TempDir creds_;
  storage::StorageOptions options_;
};

test::SharedAzurite BlobTierTest::shared_;

TEST_F(BlobTierTest, RoundTrip) {
  storage::createContainer(azurite_->url("ckpt"), options_);
  auto tier = openTier(azurite_->url("ckpt/runs/job-1"), options_);
  EXPECT_EQ(tier->describe(), azurite_->url("ckpt/runs/job-1"));
  roundTrip(*tier);
  // The removed step left no object behind.
  auto objects = storage::openStorage(azurite_->url("ckpt/runs/job-1"), options_);
  for (const auto& o : objects->list(""))
    EXPECT_EQ(o.name.rfind("step-5/", 0), std::string::npos) << o.name;
}

TEST_F(BlobTierTest, AStepWithoutItsManifestIsNotListed) {
  storage::createContainer(azurite_->url("ckpt-partial"), options_);
  auto objects = storage::openStorage(azurite_->url("ckpt-partial/run"), options_);
  // An upload interrupted before its manifest, and unrelated objects.
  objects->writeBytes("step-7/model.bin", "partial");
  objects->writeBytes("step-x/manifest.json", "{}");
  objects->writeBytes("notes/manifest.json", "{}");
  TempDir local;
  const std::string three = makeCheckpoint(local.path(), 3);
  auto tier = openTier(azurite_->url("ckpt-partial/run"), options_);
  tier->upload(three, readManifest(three));
  EXPECT_EQ(tier->list(), (std::vector<int64_t>{3}));
}

}  // namespace
}  // namespace cohort::ckpt
