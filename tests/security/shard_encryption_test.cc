// Packed shards encrypted at rest: `cohort data pack --key-file` seals every
// shard as it is written, readers decrypt and authenticate each record's
// chunks, `cohort data verify` finds what checksums miss, and a job trains on
// the encrypted dataset exactly as on the plain one.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cohort/ckpt/state_dict.h"
#include "cohort/config/job.h"
#include "cohort/core/checksum.h"
#include "cohort/core/file.h"
#include "cohort/data/dataset.h"
#include "cohort/data/dataset_manifest.h"
#include "cohort/security/keys.h"
#include "cohort/security/sealed.h"
#include "util/errors.h"
#include "util/jobs.h"
#include "util/runs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

const std::string kImages = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
const std::string kHex = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";

class EncryptedShards : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kImages)) << "dataset-fashion-mnist is installed by scripts/install-deps.sh";
    key_ = dir_.file("data.key");
    test::writeText(key_, kHex + "\n");
    ::chmod(key_.c_str(), 0600);
    for (const auto& [out, extra] : {std::pair<std::string, std::vector<std::string>>{plain(), {}},
                                     {sealed(), {"--key-file", key_}}}) {
      std::vector<std::string> args{"data", "pack", kImages, out, "--shard-mb", "2", "--no-progress"};
      args.insert(args.end(), extra.begin(), extra.end());
      const auto r = test::cohort(args);
      ASSERT_EQ(r.exitCode, 0) << r.describe();
    }
    manifest_ = data::parseDatasetManifest(test::readText(sealed() + "/dataset.json"), "sealed");
  }
  std::string plain() const { return dir_.file("plain"); }
  std::string sealed() const { return dir_.file("sealed"); }

  TempDir dir_;
  std::string key_;
  data::DatasetManifest manifest_;
};

TEST_F(EncryptedShards, NoPlaintextReachesTheDiskAndReadersSeeTheSameRecords) {
  const auto plainManifest = data::parseDatasetManifest(test::readText(plain() + "/dataset.json"), "plain");
  EXPECT_EQ(manifest_.encryptionKeyId, security::parseKey(kHex, "k").id);
  EXPECT_TRUE(plainManifest.encryptionKeyId.empty());
  ASSERT_EQ(manifest_.shards.size(), plainManifest.shards.size());
  ASSERT_GT(manifest_.shards.size(), 3u);
  // The records are the same (the same seed orders them); 40 bytes of the
  // plain shard's first record (its header and key) appear in no sealed one.
  const std::string firstRecord = test::readText(plain() + "/" + plainManifest.shards[0].name).substr(16, 40);
  for (const auto& s : manifest_.shards) {
    const std::string bytes = test::readText(sealed() + "/" + s.name);
    EXPECT_TRUE(security::isSealed(bytes.data(), bytes.size())) << s.name;
    EXPECT_EQ(bytes.find(firstRecord), std::string::npos) << s.name;
    EXPECT_EQ(bytes.find("CREC"), std::string::npos) << s.name;
  }

  security::installKeyring(security::Keyring{security::parseKey(kHex, "k"), std::nullopt});
  DatasetConfig c;
  c.kind = DataKind::shards;
  c.path = plain();
  auto a = data::openDataset(c, 10);
  c.path = sealed();
  auto b = data::openDataset(c, 10);
  ASSERT_EQ(a->size(), b->size());
  std::vector<float> x(784), y(784);
  for (int64_t i : {int64_t{0}, int64_t{1}, a->size() / 2, a->size() - 1}) {
    EXPECT_EQ(a->read(i, x.data(), 0), b->read(i, y.data(), 0));
    EXPECT_EQ(x, y) << "record " << i;
  }
  security::installKeyring(std::nullopt);
  c.path = sealed();
  const std::string noKey = test::errorOf<ConfigError>([&] {
    auto d = data::openDataset(c, 10);
    d->read(0, x.data(), 0);
  });
  EXPECT_NE(noKey.find("is encrypted (key id " + manifest_.encryptionKeyId), std::string::npos) << noKey;
}

TEST_F(EncryptedShards, VerifyAuthenticatesWhatChecksumsMiss) {
  const auto ok = test::cohort({"data", "verify", sealed(), "--key-file", key_});
  EXPECT_EQ(ok.exitCode, 0) << ok.describe();
  const auto noKey = test::cohort({"data", "verify", sealed()});
  EXPECT_NE(noKey.exitCode, 0) << noKey.describe();
  EXPECT_NE(noKey.out.find("key id " + manifest_.encryptionKeyId), std::string::npos) << noKey.describe();

  // A byte changed in shard 1, and dataset.json made to agree with the file.
  const std::string victim = sealed() + "/" + manifest_.shards[1].name;
  {
    std::fstream io(victim, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(100000);
    char c = 0;
    io.read(&c, 1);
    io.seekp(100000);
    io.put(static_cast<char>(c ^ 0x10));
  }
  auto m = nlohmann::json::parse(test::readText(sealed() + "/dataset.json"));
  m["shards"][1]["checksum"] = checksumFile(victim);
  writeFileAtomic(sealed() + "/dataset.json", m.dump(2));
  const auto bad = test::cohort({"data", "verify", sealed(), "--key-file", key_});
  EXPECT_EQ(bad.exitCode, 1) << bad.describe();
  EXPECT_NE(bad.out.find(victim + ": chunk 1 of"), std::string::npos) << bad.describe();
  EXPECT_NE(bad.out.find("fails authentication"), std::string::npos) << bad.describe();
}

TEST_F(EncryptedShards, AJobTrainsOnThemAsOnPlainShards) {
  const std::string job = dir_.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("shards"));
  auto run = [&](const std::string& data, const std::string& runDir, bool withKey) {
    std::vector<std::string> args{"run", job, "--procs", "2", "--run-dir", runDir};
    for (const std::string& kv : std::vector<std::string>{
             "data.train.kind=shards", "data.train.path=" + data, "model.num_classes=10",
             "training.max_steps=6", "checkpoint.enabled=false"}) {
      args.push_back("--set");
      args.push_back(kv);
    }
    if (withKey) {
      args.push_back("--set");
      args.push_back("security.encryption.key_file=" + key_);
    }
    return test::cohort(args, {}, std::chrono::minutes(5));
  };
  const auto a = run(plain(), dir_.file("run-plain"), false);
  ASSERT_EQ(a.exitCode, 0) << a.describe();
  const auto b = run(sealed(), dir_.file("run-sealed"), true);
  ASSERT_EQ(b.exitCode, 0) << b.describe();
  security::installKeyring(security::Keyring{security::parseKey(kHex, "k"), std::nullopt});
  EXPECT_EQ(test::maxDifference(ckpt::readStateDict(dir_.file("run-plain") + "/model/final.pt"),
                                ckpt::readStateDict(dir_.file("run-sealed") + "/model/final.pt")),
            0.0);
  security::installKeyring(std::nullopt);

  const auto c = run(sealed(), dir_.file("run-nokey"), false);
  EXPECT_EQ(c.exitCode, 2) << c.describe();
  EXPECT_NE(c.err.find("is encrypted (key id " + manifest_.encryptionKeyId), std::string::npos)
      << c.describe();
}

}  // namespace
}  // namespace cohort
