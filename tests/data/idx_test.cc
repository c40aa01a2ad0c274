#include <gtest/gtest.h>
#include <zlib.h>

#include <vector>

#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "util/process.h"

namespace cohort::data {
namespace {

std::string be32(uint32_t v) {
  return {char(v >> 24), char((v >> 16) & 0xff), char((v >> 8) & 0xff), char(v & 0xff)};
}

std::string imagesFile(uint32_t n, uint32_t h, uint32_t w) {
  std::string s = std::string("\0\0\x08\x03", 4) + be32(n) + be32(h) + be32(w);
  for (uint32_t i = 0; i < n * h * w; ++i) s += char(i % 256);
  return s;
}

std::string labelsFile(const std::vector<uint8_t>& labels) {
  std::string s = std::string("\0\0\x08\x01", 4) + be32(static_cast<uint32_t>(labels.size()));
  for (uint8_t l : labels) s += char(l);
  return s;
}

void writeGz(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, data.data(), static_cast<unsigned>(data.size()));
  gzclose(f);
}

std::string dataError(const std::string& images, const std::string& labels, int64_t classes = 10) {
  try {
    openIdx(images, labels, 0, classes);
  } catch (const DataError& e) {
    return e.what();
  }
  return "NO ERROR";
}

TEST(Idx, ReadsRawAndGzipIdentically) {
  test::TempDir dir;
  test::writeText(dir.file("img"), imagesFile(3, 2, 2));
  test::writeText(dir.file("lab"), labelsFile({1, 2, 3}));
  writeGz(dir.file("img.gz"), imagesFile(3, 2, 2));
  writeGz(dir.file("lab.gz"), labelsFile({1, 2, 3}));
  auto raw = openIdx(dir.file("img"), dir.file("lab"), 0, 10);
  auto gz = openIdx(dir.file("img.gz"), dir.file("lab.gz"), 0, 10);
  ASSERT_EQ(raw->size(), 3);
  EXPECT_EQ(raw->shape().channels, 1);
  EXPECT_EQ(raw->shape().height, 2);
  EXPECT_EQ(raw->shape().width, 2);
  std::vector<float> a(4), b(4);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(raw->read(i, a.data()), i + 1);
    EXPECT_EQ(gz->read(i, b.data()), i + 1);
    EXPECT_EQ(a, b);
    EXPECT_FLOAT_EQ(a[0], float(i * 4) / 255.0f);
  }
}

TEST(Idx, LimitKeepsTheFirstSamples) {
  test::TempDir dir;
  test::writeText(dir.file("img"), imagesFile(5, 2, 2));
  test::writeText(dir.file("lab"), labelsFile({0, 1, 2, 3, 4}));
  EXPECT_EQ(openIdx(dir.file("img"), dir.file("lab"), 2, 10)->size(), 2);
}

TEST(Idx, TruncatedFileNamesPathExpectedAndActualSizes) {
  test::TempDir dir;
  std::string img = imagesFile(4, 3, 3);
  test::writeText(dir.file("img"), img.substr(0, img.size() - 5));
  test::writeText(dir.file("lab"), labelsFile({0, 1, 2, 3}));
  std::string e = dataError(dir.file("img"), dir.file("lab"));
  EXPECT_NE(e.find(dir.file("img") + ": truncated: expected 52 bytes (16-byte header + 4x3x3 "
                                     "images), got 47"),
            std::string::npos)
      << e;
}

TEST(Idx, TruncatedGzipStream) {
  test::TempDir dir;
  writeGz(dir.file("full.gz"), imagesFile(100, 8, 8));
  std::string gz = test::readText(dir.file("full.gz"));
  test::writeText(dir.file("img.gz"), gz.substr(0, gz.size() / 2));
  test::writeText(dir.file("lab"), labelsFile(std::vector<uint8_t>(100, 1)));
  std::string e = dataError(dir.file("img.gz"), dir.file("lab"));
  EXPECT_NE(e.find(dir.file("img.gz")), std::string::npos) << e;
  EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("corrupt") != std::string::npos)
      << e;
}

TEST(Idx, NotAnIdxFile) {
  test::TempDir dir;
  test::writeText(dir.file("img"), "hello, this is text and not IDX");
  test::writeText(dir.file("lab"), labelsFile({0}));
  std::string e = dataError(dir.file("img"), dir.file("lab"));
  EXPECT_NE(e.find(dir.file("img") + ": not an IDX file"), std::string::npos) << e;
}

TEST(Idx, LabelsMustMatchImagesAndClasses) {
  test::TempDir dir;
  test::writeText(dir.file("img"), imagesFile(3, 2, 2));
  test::writeText(dir.file("lab"), labelsFile({0, 1}));
  std::string e = dataError(dir.file("img"), dir.file("lab"));
  EXPECT_NE(e.find("holds 3 images but " + dir.file("lab") + " holds 2 labels"), std::string::npos)
      << e;
  test::writeText(dir.file("lab"), labelsFile({0, 1, 12}));
  e = dataError(dir.file("img"), dir.file("lab"));
  EXPECT_NE(e.find("label 12 of sample 2 is not below model.num_classes = 10"), std::string::npos)
      << e;
}

TEST(Synthetic, DeterministicPerSampleAndLabelsInRange) {
  auto a = makeSynthetic(50, {3, 4, 4}, 7, 11);
  auto b = makeSynthetic(50, {3, 4, 4}, 7, 11);
  auto c = makeSynthetic(50, {3, 4, 4}, 7, 12);
  std::vector<float> x(48), y(48), z(48);
  bool anyDiffer = false;
  for (int64_t i = 0; i < 50; ++i) {
    int64_t la = a->read(i, x.data());
    EXPECT_EQ(b->read(i, y.data()), la);
    EXPECT_EQ(x, y);
    EXPECT_GE(la, 0);
    EXPECT_LT(la, 7);
    c->read(i, z.data());
    anyDiffer = anyDiffer || x != z;
    for (float v : x) {
      EXPECT_GE(v, 0.0f);
      EXPECT_LE(v, 1.0f);
    }
  }
  EXPECT_TRUE(anyDiffer) << "the seed does not change the samples";
}

TEST(Synthetic, ClassPatternIsSharedAcrossSeeds) {
  // A training set and an evaluation set with different seeds must agree on
  // what a class looks like, or evaluation would measure nothing.
  auto train = makeSynthetic(200, {1, 16, 16}, 3, 0);
  auto eval = makeSynthetic(200, {1, 16, 16}, 3, 1);
  std::vector<float> a(256), b(256);
  int64_t la = train->read(0, a.data());
  int64_t i = 0;
  while (eval->read(i, b.data()) != la) ++i;
  int agree = 0, against = 0;
  for (int k = 0; k < 256; ++k) {
    ((a[k] > 0.5f) == (b[k] > 0.5f) ? agree : against)++;
  }
  EXPECT_GT(agree, 4 * against) << "same class, different seeds: patterns should match";
  // Different classes look different.
  int64_t j = 0;
  while (eval->read(j, b.data()) == la) ++j;
  agree = against = 0;
  for (int k = 0; k < 256; ++k) {
    ((a[k] > 0.5f) == (b[k] > 0.5f) ? agree : against)++;
  }
  EXPECT_LT(agree, 4 * against);
}

}  // namespace
}  // namespace cohort::data
