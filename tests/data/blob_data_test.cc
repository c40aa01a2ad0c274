// Packed shards on blob storage (Azurite on loopback): `cohort data pack` to
// a blob URL, the first epoch streaming while shards land in the node-local
// cache, later epochs reading the cache only, ranks of a node sharing one
// copy, eviction under a size limit, and errors that name the URL without
// the secret.

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <regex>

#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "cohort/data/shard_source.h"
#include "cohort/security/keys.h"
#include "cohort/storage/storage.h"
#include "test_paths.h"
#include "util/azurite.h"
#include "util/process.h"

namespace cohort::data {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

test::SharedAzurite azurite;

class BlobData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    azurite.start();
    if (!azurite.get()) return;
    images_ = new TempDir;
    // A failure here is kept for SetUp to report in every test: an
    // assertion in SetUpTestSuite would make gtest skip the tests, and CTest
    // count them as skipped rather than failed.
    const auto made = test::run({COHORT_PYTHON, std::string(COHORT_SOURCE_DIR) + "/scripts/make-imagenet-like.py",
                                 images_->file("img"), "--classes", "3", "--per-class", "10", "--seed", "1"});
    if (made.exitCode != 0) {
      setupError_ = "making the images failed: " + made.describe();
      return;
    }
    const auto packed = cohort({"data", "pack", images_->file("img"), url("data/train"), "--shard-mb", "0.2",
                                "--no-progress"});
    if (packed.exitCode != 0) setupError_ = "packing them into the blob store failed: " + packed.describe();
  }
  static void TearDownTestSuite() {
    azurite.stop();
    delete images_;
    images_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(azurite.get(), nullptr) << azurite.error();
    ASSERT_TRUE(setupError_.empty()) << setupError_;
  }

  static std::string url(const std::string& path) { return azurite.get()->url(path); }
  static std::map<std::string, std::string> env() {
    return {{"AZURE_STORAGE_KEY", test::Azurite::kKey}};
  }
  static test::ProcessResult cohort(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {COHORT_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--allow-insecure");
    return test::run(argv, env());
  }
  static storage::StorageOptions options() {
    storage::StorageOptions o;
    o.allowInsecure = true;
    return o;
  }
  static std::vector<std::string> cachedShards(const std::string& dir) {
    std::vector<std::string> out;
    if (!fs::exists(dir)) return out;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (e.is_regular_file() && n.size() > 7 && n.compare(n.size() - 7, 7, ".cohort") == 0) {
        out.push_back(n);
      }
      EXPECT_EQ(n.find(".part-"), std::string::npos) << "a partial download was left behind: " << n;
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  static TempDir* images_;
  static std::string setupError_;  // what SetUpTestSuite could not do
};
TempDir* BlobData::images_ = nullptr;
std::string BlobData::setupError_;

class EnvKey {
 public:
  EnvKey() { ::setenv("AZURE_STORAGE_KEY", test::Azurite::kKey, 1); }
  ~EnvKey() { ::unsetenv("AZURE_STORAGE_KEY"); }
};

TEST_F(BlobData, FirstEpochStreamsLaterEpochsReadTheCache) {
  EnvKey key;
  TempDir cache;
  CacheConfig cc;
  cc.dir = cache.path();
  ShardSource source(url("data/train"), options(), cc);
  const DatasetManifest& m = source.manifest();
  ASSERT_GE(m.shards.size(), 3u);
  EXPECT_EQ(source.describe().find(test::Azurite::kKey), std::string::npos);

  // Epoch 1 reads records before any shard is cached: ranged GETs.
  std::vector<std::string> firstRead;
  for (size_t s = 0; s < m.shards.size(); ++s) firstRead.push_back(source.read(int(s), 0, m.shards[s].bytes));
  const ShardSourceStats before = source.stats();
  EXPECT_EQ(before.remoteReads, static_cast<int64_t>(m.shards.size()));
  EXPECT_EQ(before.shardsDownloaded, 0);

  // The fetcher downloads the planned shards into the cache.
  std::vector<int> all;
  for (size_t s = 0; s < m.shards.size(); ++s) all.push_back(static_cast<int>(s));
  source.plan(all);
  source.waitForPlan();
  EXPECT_EQ(source.stats().shardsDownloaded, static_cast<int64_t>(m.shards.size()));
  EXPECT_EQ(cachedShards(cache.path()).size(), m.shards.size());

  // Epoch 2: the same bytes, from local disk, no request.
  for (size_t s = 0; s < m.shards.size(); ++s) {
    EXPECT_EQ(source.read(int(s), 0, m.shards[s].bytes), firstRead[s]) << m.shards[s].name;
  }
  const ShardSourceStats after = source.stats();
  EXPECT_EQ(after.remoteReads, before.remoteReads);
  EXPECT_GE(after.localBytes, m.bytes());

  // A second reader of the same dataset (a later run) finds the cache full.
  ShardSource again(url("data/train"), options(), cc);
  again.plan(all);
  again.waitForPlan();
  EXPECT_EQ(again.stats().shardsDownloaded, 0);
  for (size_t s = 0; s < m.shards.size(); ++s) again.read(int(s), 0, 100);
  EXPECT_EQ(again.stats().remoteReads, 0);
}

TEST_F(BlobData, EvictionKeepsTheCacheUnderItsLimit) {
  EnvKey key;
  TempDir cache;
  CacheConfig cc;
  cc.dir = cache.path();
  ShardSource probe(url("data/train"), options(), CacheConfig{false, "", 0});
  const DatasetManifest& m = probe.manifest();
  int64_t largest = 0;
  for (const auto& s : m.shards) largest = std::max(largest, s.bytes);
  cc.maxGb = 2.5 * double(largest) / 1e9;  // room for two shards
  ShardSource source(url("data/train"), options(), cc);
  std::vector<int> all;
  for (size_t s = 0; s < m.shards.size(); ++s) all.push_back(static_cast<int>(s));
  source.plan(all);
  source.waitForPlan();
  EXPECT_EQ(source.stats().shardsDownloaded, static_cast<int64_t>(m.shards.size()));
  const auto kept = cachedShards(cache.path());
  int64_t keptBytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(cache.path())) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && n.size() > 7 && n.compare(n.size() - 7, 7, ".cohort") == 0) {
      keptBytes += static_cast<int64_t>(e.file_size());
    }
  }
  EXPECT_LE(keptBytes, static_cast<int64_t>(cc.maxGb * 1e9));
  EXPECT_LT(kept.size(), m.shards.size());
  EXPECT_GE(kept.size(), 1u);
  // The newest download is kept.
  EXPECT_NE(std::find(kept.begin(), kept.end(), m.shards.back().name), kept.end());
  // Evicted shards still read (ranged GETs).
  for (size_t s = 0; s < m.shards.size(); ++s) EXPECT_EQ(source.read(int(s), 0, 16).size(), 16u);
}

TEST_F(BlobData, TwoRanksShareOneCopyAndTrain) {
  TempDir run;
  const std::string cache = run.file("cache");
  std::vector<std::string> argv = {
      COHORT_BIN, "run", std::string(COHORT_SOURCE_DIR) + "/examples/imagenet-style.yaml",
      "--run-dir", run.file("r"), "--procs", "2",
      "--set", "data.train.path=" + url("data/train"),
      "--set", "data.eval.kind=none",
      "--set", "data.train.crop_size=16",
      "--set", "data.cache.dir=" + cache,
      "--set", "storage.allow_insecure=true",
      "--set", "model.num_classes=3",
      "--set", "model.arch=simple_cnn",
      "--set", "training.epochs=2",
      "--set", "training.batch_size=4",
      "--set", "checkpoint.enabled=false",
      "--set", "output.progress=off"};
  const auto r = test::run(argv, env(), std::chrono::minutes(5));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  // Every shard is in the cache once; the ranks split the downloads.
  EnvKey key;
  ShardSource probe(url("data/train"), options(), CacheConfig{false, "", 0});
  const size_t shards = probe.manifest().shards.size();
  EXPECT_EQ(cachedShards(cache).size(), shards);
  // Each rank logs, after each epoch, how many shards it downloaded; summed
  // over the ranks after the last epoch, that is every shard exactly once.
  int64_t downloaded = 0;
  const std::regex line(R"(training data after epoch 2: .* (\d+) shards \(.*\) downloaded into the cache)");
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = test::readText(run.file("r") + "/logs/rank-" + std::to_string(rank) + ".log");
    std::smatch mm;
    ASSERT_TRUE(std::regex_search(log, mm, line)) << "rank " << rank << " log:\n" << log;
    downloaded += std::stoll(mm[1]);
  }
  EXPECT_EQ(downloaded, static_cast<int64_t>(shards));
}

TEST_F(BlobData, AnUnusableCacheDirectoryMeansReadingRemotely) {
  EnvKey key;
  CacheConfig cc;
  cc.dir = "/dev/null/cache";  // cannot be created
  ShardSource source(url("data/train"), options(), cc);
  EXPECT_TRUE(source.cacheDir().empty());
  const auto& m = source.manifest();
  std::vector<int> all;
  for (size_t s = 0; s < m.shards.size(); ++s) all.push_back(static_cast<int>(s));
  source.plan(all);
  for (size_t s = 0; s < m.shards.size(); ++s) EXPECT_EQ(source.read(int(s), 0, 16).size(), 16u);
  EXPECT_EQ(source.stats().remoteReads, static_cast<int64_t>(m.shards.size()));
  EXPECT_EQ(source.stats().shardsDownloaded, 0);
}

TEST_F(BlobData, WrongKeyAndMissingDatasetAreNamedWithoutSecrets) {
  const std::string wrongKey = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==";
  auto r = test::run({COHORT_BIN, "data", "inspect", url("data/train"), "--allow-insecure"},
                     {{"AZURE_STORAGE_KEY", wrongKey}});
  EXPECT_NE(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.err.find("403"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("data/train"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(wrongKey), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("retry"), std::string::npos) << "an authentication error is not retried:\n" << r.err;

  r = cohort({"data", "inspect", url("data/nothing-here")});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("no packed dataset here"), std::string::npos) << r.err;
}

TEST_F(BlobData, VerifyReadsEveryShardFromBlobStorage) {
  const auto r = cohort({"data", "verify", url("data/train")});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.out.find("30 records: valid"), std::string::npos) << r.out;
}

// Encrypted shards on blob storage: the same records as the plain pack, read
// first with ranged GETs of the covering chunks, then from the cache; the
// container holds no plaintext record.
TEST_F(BlobData, EncryptedShardsStreamAndCacheLikePlainOnes) {
  TempDir dir;
  const std::string key = dir.file("data.key");
  const std::string hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
  test::writeText(key, hex + "\n");
  ::chmod(key.c_str(), 0600);
  const auto packed = cohort({"data", "pack", images_->file("img"), url("data/sealed"), "--shard-mb",
                              "0.2", "--no-progress", "--key-file", key});
  ASSERT_EQ(packed.exitCode, 0) << packed.describe();
  const auto verified = cohort({"data", "verify", url("data/sealed"), "--key-file", key});
  EXPECT_EQ(verified.exitCode, 0) << verified.describe();

  EnvKey envKey;
  security::installKeyring(security::Keyring{security::parseKey(hex, "k"), std::nullopt});
  TempDir cache;
  CacheConfig cc;
  cc.dir = cache.path();
  CacheConfig off;
  off.enabled = false;
  ShardSource plain(url("data/train"), options(), off);
  ShardSource sealed(url("data/sealed"), options(), cc);
  const DatasetManifest& m = sealed.manifest();
  ASSERT_EQ(m.shards.size(), plain.manifest().shards.size());
  ASSERT_FALSE(m.encryptionKeyId.empty());
  auto remote = storage::openStorage(url("data/sealed"), options());
  for (size_t s = 0; s < m.shards.size(); ++s) {
    const int i = static_cast<int>(s);
    ASSERT_EQ(sealed.shardBytes(i), plain.manifest().shards[s].bytes);
    EXPECT_EQ(sealed.read(i, 1000, 5000), plain.read(i, 1000, 5000)) << m.shards[s].name;
    const std::string stored = remote->readRange(m.shards[s].name, 0, m.shards[s].bytes);
    EXPECT_EQ(stored.find("CREC"), std::string::npos) << "a record header in " << m.shards[s].name;
  }
  EXPECT_GT(sealed.stats().remoteReads, 0);
  std::vector<int> all;
  for (size_t s = 0; s < m.shards.size(); ++s) all.push_back(static_cast<int>(s));
  sealed.plan(all);
  sealed.waitForPlan();
  const int64_t before = sealed.stats().remoteReads;
  for (size_t s = 0; s < m.shards.size(); ++s) {
    const int i = static_cast<int>(s);
    EXPECT_EQ(sealed.read(i, 0, sealed.shardBytes(i)), plain.read(i, 0, plain.manifest().shards[s].bytes));
  }
  EXPECT_EQ(sealed.stats().remoteReads, before) << "cached shards are read locally";
  security::installKeyring(std::nullopt);
}

}  // namespace
}  // namespace cohort::data
