// The shard format, `cohort data pack|inspect|verify`, and packed shards read
// as a dataset: round trips, corruption caught with shard and offset, the
// shuffle order's properties, corrupt images skipped or failing.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "cohort/data/dataset_manifest.h"
#include "cohort/data/pack.h"
#include "cohort/data/sampler.h"
#include "cohort/data/shard.h"
#include "test_paths.h"
#include "util/process.h"

namespace cohort::data {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

ReadAt fileReader(const std::string& bytes) {
  return [&bytes](int64_t o, int64_t n) {
    if (o < 0 || o + n > static_cast<int64_t>(bytes.size())) throw DataError("read past the end");
    return bytes.substr(static_cast<size_t>(o), static_cast<size_t>(n));
  };
}

void flipByte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(offset);
  f.write(&c, 1);
}

TEST(ShardFormat, RoundTripThroughIndexAndScan) {
  TempDir dir;
  const std::string path = dir.file("s.cohort");
  std::vector<Record> written;
  {
    ShardWriter w(path);
    for (int i = 0; i < 50; ++i) {
      Record r{"key-" + std::to_string(i), i % 7, std::string(static_cast<size_t>(i * 37), char('a' + i % 26))};
      w.add(r.key, r.label, r.payload.data(), r.payload.size());
      written.push_back(r);
    }
    EXPECT_EQ(w.records(), 50);
    const int64_t size = w.finish();
    EXPECT_EQ(size, static_cast<int64_t>(fs::file_size(path)));
  }
  const std::string bytes = slurp(path);
  const auto offsets = readShardIndex(fileReader(bytes), bytes.size(), "s.cohort").offsets;
  ASSERT_EQ(offsets.size(), 50u);
  for (size_t i = 0; i < offsets.size(); ++i) {
    const RecordHeader h = parseRecordHeader(bytes.substr(offsets[i], kRecordHeaderBytes), offsets[i], "s");
    const Record r = parseRecord(bytes.substr(offsets[i], h.totalBytes()), offsets[i], "s");
    EXPECT_EQ(r.key, written[i].key);
    EXPECT_EQ(r.label, written[i].label);
    EXPECT_EQ(r.payload, written[i].payload);
  }
  size_t n = 0;
  scanShard(fileReader(bytes), bytes.size(), "s.cohort", [&](const Record& r, int64_t offset) {
    EXPECT_EQ(offset, offsets[n]);
    EXPECT_EQ(r.key, written[n].key);
    ++n;
  });
  EXPECT_EQ(n, 50u);
}

TEST(ShardFormat, EmptyShardIsValid) {
  TempDir dir;
  ShardWriter w(dir.file("e.cohort"));
  w.finish();
  const std::string bytes = slurp(dir.file("e.cohort"));
  EXPECT_EQ(readShardIndex(fileReader(bytes), bytes.size(), "e").size(), 0u);
}

TEST(ShardFormat, UnfinishedShardIsRemoved) {
  TempDir dir;
  {
    ShardWriter w(dir.file("u.cohort"));
    w.add("k", 0, "x", 1);
  }
  EXPECT_FALSE(fs::exists(dir.file("u.cohort")));
}

TEST(ShardFormat, CorruptPayloadNamesShardAndOffset) {
  TempDir dir;
  const std::string path = dir.file("c.cohort");
  {
    ShardWriter w(path);
    for (int i = 0; i < 3; ++i) w.add("k" + std::to_string(i), i, std::string(100, 'x').data(), 100);
    w.finish();
  }
  std::string bytes = slurp(path);
  const auto offsets = readShardIndex(fileReader(bytes), bytes.size(), "c.cohort").offsets;
  flipByte(path, offsets[1] + kRecordHeaderBytes + 2 + 50);  // inside record 1's payload
  bytes = slurp(path);
  try {
    parseRecord(bytes.substr(offsets[1], offsets[2] - offsets[1]), offsets[1], "c.cohort");
    FAIL() << "a flipped payload byte was not caught";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("c.cohort"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset " + std::to_string(offsets[1])), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
}

TEST(ShardFormat, TruncatedShardNamesShardAndOffset) {
  TempDir dir;
  const std::string path = dir.file("t.cohort");
  {
    ShardWriter w(path);
    for (int i = 0; i < 10; ++i) w.add("k", i, std::string(1000, 'y').data(), 1000);
    w.finish();
  }
  const std::string bytes = slurp(path).substr(0, 5000);
  try {
    readShardIndex(fileReader(bytes), bytes.size(), "t.cohort");
    FAIL() << "a truncated shard was not caught";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("t.cohort: corrupt or truncated shard at offset"),
              std::string::npos) << e.what();
  }
}

TEST(ShardFormat, ManifestRoundTripAndRejects) {
  DatasetManifest m;
  m.name = "d";
  m.classes = {"a", "b"};
  m.shards = {{"shard-00000.cohort", 3, 100, "0123456789abcdef"}, {"shard-00001.cohort", 2, 90, "fedcba9876543210"}};
  const DatasetManifest back = parseDatasetManifest(datasetManifestJson(m), "x");
  EXPECT_EQ(back.records(), 5);
  EXPECT_EQ(back.shards[1].checksum, "fedcba9876543210");
  EXPECT_EQ(back.classes, m.classes);
  EXPECT_THROW(parseDatasetManifest("{", "x"), DataError);
  EXPECT_THROW(parseDatasetManifest(R"({"format":"other"})", "x"), DataError);
  m.shards[0].name = "../escape";
  EXPECT_THROW(parseDatasetManifest(datasetManifestJson(m), "x"), DataError);
}

TEST(ShardOrder, IsAPermutationGroupedByWindowAndDeterministic) {
  const std::vector<int64_t> counts = {10, 0, 7, 13, 10, 10, 5, 10, 9};
  std::vector<int64_t> first = {0};
  for (int64_t c : counts) first.push_back(first.back() + c);
  const auto shardOf = [&](int64_t i) {
    return static_cast<int>(std::upper_bound(first.begin(), first.end(), i) - first.begin()) - 1;
  };
  const auto a = shuffledShardOrder(counts, 3, 7, 1);
  EXPECT_EQ(a, shuffledShardOrder(counts, 3, 7, 1));
  EXPECT_NE(a, shuffledShardOrder(counts, 3, 7, 2));
  EXPECT_NE(a, shuffledShardOrder(counts, 3, 8, 1));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < first.back(); ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
  // Walking the order, a reader has at most 3 shards (the window) open at
  // a time: a shard opens at its first record and closes after its last.
  std::vector<int64_t> left = counts;
  std::set<int> open;
  for (int64_t i : a) {
    const int s = shardOf(i);
    open.insert(s);
    ASSERT_LE(open.size(), 3u);
    if (--left[static_cast<size_t>(s)] == 0) open.erase(s);
  }
  // Records are mixed within a group: not in shard order.
  EXPECT_FALSE(std::is_sorted(a.begin(), a.begin() + 20));
}

// ---- pack, inspect, verify, read ----------------------------------------

// An ImageNet-style folder from scripts/make-imagenet-like.py.
void makeImages(const std::string& dst, int classes, int perClass) {
  const auto r = test::run({COHORT_PYTHON, std::string(COHORT_SOURCE_DIR) + "/scripts/make-imagenet-like.py",
                            dst, "--classes", std::to_string(classes), "--per-class",
                            std::to_string(perClass), "--seed", "3"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
}

test::ProcessResult cohort(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {COHORT_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return test::run(argv);
}

class PackedFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    images_ = dir_.file("images");
    makeImages(images_, 3, 8);
    // A file that is not an image, and a JPEG cut short (its header reads,
    // its data does not decode).
    test::writeText(images_ + "/n00000001/garbage.jpg", "this is not a JPEG");
    const std::string some = images_ + "/n00000002/n00000002_0.JPEG";
    const std::string whole = slurp(some);
    test::writeText(images_ + "/n00000002/cut.jpg", whole.substr(0, whole.size() / 3));
    shards_ = dir_.file("packed");
  }
  TempDir dir_;
  std::string images_, shards_;
};

TEST_F(PackedFolder, PackInspectVerifyAndRead) {
  const auto packed = cohort({"data", "pack", images_, shards_, "--shard-mb", "0.3", "--threads", "2",
                              "--no-progress"});
  ASSERT_EQ(packed.exitCode, 0) << packed.describe();
  EXPECT_NE(packed.out.find("packed 25 records of 3 classes"), std::string::npos) << packed.out;
  EXPECT_NE(packed.err.find("garbage.jpg"), std::string::npos) << "the unreadable file is named";

  const DatasetManifest m = parseDatasetManifest(slurp(shards_ + "/dataset.json"), "dataset.json");
  EXPECT_GT(m.shards.size(), 2u) << "0.3 MB shards of ~30 kB images";
  EXPECT_EQ(m.records(), 25);
  EXPECT_EQ(m.classes, (std::vector<std::string>{"n00000000", "n00000001", "n00000002"}));

  const auto inspect = cohort({"data", "inspect", shards_, "--records", "3"});
  ASSERT_EQ(inspect.exitCode, 0) << inspect.describe();
  EXPECT_NE(inspect.out.find("records  25"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find(m.shards[0].name), std::string::npos) << inspect.out;

  // The shard holding the cut JPEG is intact as a shard; --decode finds the image.
  const auto verify = cohort({"data", "verify", shards_});
  EXPECT_EQ(verify.exitCode, 0) << verify.describe();
  const auto decoded = cohort({"data", "verify", shards_, "--decode"});
  EXPECT_EQ(decoded.exitCode, 1) << decoded.describe();
  EXPECT_NE(decoded.out.find("n00000002/cut.jpg"), std::string::npos) << decoded.out;

  // Read as a dataset: every file once, with its folder's label.
  DatasetConfig c;
  c.kind = DataKind::shards;
  c.path = shards_;
  c.cropSize = 32;
  auto ds = openDataset(c, 3);
  ASSERT_EQ(ds->size(), 25);
  EXPECT_EQ(ds->shape().channels, 3);
  EXPECT_EQ(ds->shape().height, 32);
  std::vector<float> px(3 * 32 * 32);
  int skipped = 0;
  std::map<int64_t, int> perLabel;
  for (int64_t i = 0; i < ds->size(); ++i) {
    const int64_t label = ds->read(i, px.data(), 1);
    if (label == kSkippedSample) {
      ++skipped;
      continue;
    }
    ++perLabel[label];
    const auto [lo, hi] = std::minmax_element(px.begin(), px.end());
    EXPECT_GE(*lo, 0.0f);
    EXPECT_LE(*hi, 1.0f);
    EXPECT_LT(*lo, *hi) << "sample " << i << " decoded to a constant image";
  }
  EXPECT_EQ(skipped, 1) << "the cut JPEG";
  EXPECT_EQ(perLabel[0], 8);
  EXPECT_EQ(perLabel[1], 8);
  EXPECT_EQ(perLabel[2], 8);

  // on_corrupt: fail names the record.
  c.onCorrupt = OnCorrupt::fail;
  auto strict = openDataset(c, 3);
  bool threw = false;
  for (int64_t i = 0; i < strict->size(); ++i) {
    try {
      strict->read(i, px.data(), 1);
    } catch (const DataError& e) {
      threw = true;
      EXPECT_NE(std::string(e.what()).find("cut.jpg"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(threw);
}

TEST_F(PackedFolder, VerifyAndReadCatchAFlippedByte) {
  ASSERT_EQ(cohort({"data", "pack", images_, shards_, "--shard-mb", "0.3", "--no-progress"}).exitCode, 0);
  const DatasetManifest m = parseDatasetManifest(slurp(shards_ + "/dataset.json"), "dataset.json");
  const std::string shard = shards_ + "/" + m.shards[0].name;
  const std::string bytes = slurp(shard);
  const auto offsets = readShardIndex(fileReader(bytes), bytes.size(), "s").offsets;
  flipByte(shard, offsets[0] + kRecordHeaderBytes + 100);
  const auto verify = cohort({"data", "verify", shards_});
  EXPECT_EQ(verify.exitCode, 1) << verify.describe();
  EXPECT_NE(verify.out.find(m.shards[0].name + ": corrupt or truncated shard at offset " +
                            std::to_string(offsets[0])),
            std::string::npos)
      << verify.out;

  DatasetConfig c;
  c.kind = DataKind::shards;
  c.path = shards_;
  c.cropSize = 16;
  auto ds = openDataset(c, 3);
  std::vector<float> px(3 * 16 * 16);
  try {
    ds->read(0, px.data(), 0);  // sample 0 is shard 0's first record
    FAIL() << "a corrupt record was read";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(m.shards[0].name), std::string::npos) << e.what();
  }
}

TEST(PackIdx, RawRecordsEqualTheIdxSamples) {
  TempDir dir;
  const std::string images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
  ASSERT_TRUE(fs::exists(images)) << "dataset-fashion-mnist is installed by scripts/install-deps.sh";
  const auto packed = cohort({"data", "pack", images, dir.file("fm"), "--shard-mb", "2", "--no-progress"});
  ASSERT_EQ(packed.exitCode, 0) << packed.describe();
  auto idx = openIdx(images, "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", 0, 10);
  DatasetConfig c;
  c.kind = DataKind::shards;
  c.path = dir.file("fm");
  auto ds = openDataset(c, 10);
  ASSERT_EQ(ds->size(), idx->size());
  EXPECT_EQ(ds->shape().height, 28);
  // Records are shuffled across shards; their keys are the IDX indices. Map
  // through the label+pixels of a few records.
  const DatasetManifest m = parseDatasetManifest(slurp(dir.file("fm") + "/dataset.json"), "m");
  EXPECT_EQ(m.encoding, "raw");
  EXPECT_GT(m.shards.size(), 3u);
  const std::string shard0 = slurp(dir.file("fm") + "/" + m.shards[0].name);
  const ShardIndex index = readShardIndex(fileReader(shard0), shard0.size(), "s");
  ASSERT_GE(index.size(), 20u);
  std::vector<float> a(784), b(784);
  for (size_t r = 0; r < 20; ++r) {
    const Record rec = parseRecord(shard0.substr(index.begin(r), index.end(r) - index.begin(r)),
                                   index.begin(r), "s");
    const int64_t index = std::stoll(rec.key);
    EXPECT_EQ(ds->read(static_cast<int64_t>(r), a.data(), 0), idx->read(index, b.data()));
    EXPECT_EQ(a, b) << "record " << r << " (IDX sample " << index << ")";
  }
}

TEST(PackErrors, MissingOrEmptySourcesAreNamed) {
  TempDir dir;
  auto r = cohort({"data", "pack", dir.file("nope"), dir.file("out")});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.err.find(dir.file("nope")), std::string::npos) << r.err;
  fs::create_directories(dir.file("empty"));
  r = cohort({"data", "pack", dir.file("empty"), dir.file("out")});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.err.find("no class folders"), std::string::npos) << r.err;
  r = cohort({"data", "inspect", dir.file("empty")});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.err.find("dataset.json"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cohort::data
