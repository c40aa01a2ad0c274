// Image decoding and the ImageNet transforms. Fixtures are encoded here from
// known pixel patterns (TurboJPEG, libpng); the last tests compare with
// torchvision on the same files (Debian's python3-torchvision).

#include "cohort/data/image.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "cohort/core/error.h"
#include "test_paths.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/python.h"

namespace cohort::data {
namespace {

using Bytes = std::vector<uint8_t>;

// Interleaved 8-bit pixels.
struct Pixels {
  int width = 0, height = 0, channels = 0;
  Bytes data;
  uint8_t& at(int y, int x, int c) { return data[(size_t(y) * width + x) * channels + c]; }
};

template <typename F>
Pixels makePixels(int width, int height, int channels, F value) {
  Pixels p{width, height, channels, Bytes(size_t(width) * height * channels)};
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c) p.at(y, x, c) = uint8_t(value(y, x, c));
    }
  }
  return p;
}

// A smooth colour pattern: what JPEG keeps well.
Pixels smooth(int width, int height) {
  return makePixels(width, height, 3, [&](int y, int x, int c) {
    const double u = double(x) / width, v = double(y) / height;
    const double s = c == 0 ? u : c == 1 ? v : 0.5 + 0.4 * std::sin(6.0 * (u + v));
    return std::lround(30 + 190 * s);
  });
}

Bytes encodeJpeg(const Pixels& p, int quality, int subsampling = TJSAMP_444) {
  tjhandle h = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int format = p.channels == 1 ? TJPF_GRAY : p.channels == 4 ? TJPF_CMYK : TJPF_RGB;
  const int samp = p.channels == 1 ? TJSAMP_GRAY : subsampling;
  const int rc = tjCompress2(h, p.data.data(), p.width, 0, p.height, format, &buf, &size, samp,
                             quality, TJFLAG_ACCURATEDCT);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(h);
  Bytes out(buf, buf + size);
  tjFree(buf);
  tjDestroy(h);
  return out;
}

Bytes encodePng(const Pixels& p) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = p.width;
  image.height = p.height;
  image.format = p.channels == 1   ? PNG_FORMAT_GRAY
                 : p.channels == 2 ? PNG_FORMAT_GA
                 : p.channels == 3 ? PNG_FORMAT_RGB
                                   : PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_get_memory_size(image, size, 0, p.data.data(), 0, nullptr));
  Bytes out(size);
  EXPECT_TRUE(png_image_write_to_memory(&image, out.data(), &size, 0, p.data.data(), 0, nullptr))
      << image.message;
  out.resize(size);
  return out;
}

ImageTransform evalTransform(int64_t h, int64_t w, int64_t shorter, int64_t channels = 3) {
  ImageTransform t;
  t.outHeight = h;
  t.outWidth = w;
  t.resizeShorter = shorter;
  t.channels = channels;
  return t;
}

std::vector<float> decode(const Bytes& b, const ImageTransform& t, uint64_t seed = 0) {
  std::vector<float> out(size_t(t.channels * t.outHeight * t.outWidth), -1.0f);
  decodeImage(b.data(), b.size(), t, seed, out.data());
  return out;
}

struct Diff {
  double mean = 0, max = 0;
};

// `out` is channel-major floats, `ref` interleaved bytes of the same size.
Diff diff(const std::vector<float>& out, const Pixels& ref) {
  Diff d;
  const size_t plane = size_t(ref.width) * ref.height;
  EXPECT_EQ(out.size(), plane * ref.channels);
  for (int c = 0; c < ref.channels; ++c) {
    for (size_t i = 0; i < plane; ++i) {
      const double e = std::fabs(out[c * plane + i] - ref.data[i * ref.channels + c] / 255.0);
      d.mean += e;
      d.max = std::max(d.max, e);
    }
  }
  d.mean /= double(out.size());
  return d;
}

std::string errorOf(const Bytes& b, const ImageTransform& t) {
  try {
    decode(b, t);
  } catch (const DataError& e) {
    return e.what();
  }
  return "NO ERROR";
}

TEST(Image, ProbeReadsSizeChannelsAndFormat) {
  const Bytes jpeg = encodeJpeg(smooth(37, 23), 90);
  auto j = probeImage(jpeg.data(), jpeg.size());
  EXPECT_EQ(j.height, 23);
  EXPECT_EQ(j.width, 37);
  EXPECT_EQ(j.channels, 3);
  EXPECT_EQ(j.format, "jpeg");
  const Bytes gray = encodeJpeg(makePixels(20, 10, 1, [](int, int x, int) { return x * 10; }), 90);
  EXPECT_EQ(probeImage(gray.data(), gray.size()).channels, 1);
  const Bytes png = encodePng(makePixels(5, 7, 4, [](int, int, int) { return 9; }));
  auto p = probeImage(png.data(), png.size());
  EXPECT_EQ(p.height, 7);
  EXPECT_EQ(p.width, 5);
  EXPECT_EQ(p.channels, 4);
  EXPECT_EQ(p.format, "png");
}

TEST(Image, GarbageAndEmptyBytesAreNotImages) {
  const Bytes garbage = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
  EXPECT_THROW(probeImage(garbage.data(), garbage.size()), DataError);
  EXPECT_NE(errorOf(garbage, evalTransform(8, 8, 0)).find("not a JPEG or PNG image"),
            std::string::npos);
  EXPECT_THROW(probeImage(nullptr, 0), DataError);
  // A JPEG signature followed by garbage: libjpeg's own message.
  Bytes fake = {0xFF, 0xD8, 0xFF, 0x00, 0x01, 0x02, 0x03, 0x04};
  EXPECT_THROW(probeImage(fake.data(), fake.size()), DataError);
  EXPECT_NE(errorOf(fake, evalTransform(8, 8, 0)).find("corrupt JPEG"), std::string::npos);
}

TEST(Image, TruncatedImagesAreCorrupt) {
  const Bytes jpeg = encodeJpeg(smooth(300, 200), 90);
  const Bytes half(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  ImageTransform train;
  train.randomResizedCrop = true;
  train.outHeight = train.outWidth = 64;
  // Every crop, including those in the intact top half, must fail.
  for (uint64_t seed = 0; seed < 20; ++seed) {
    EXPECT_THROW(decode(half, train, seed), DataError) << "seed " << seed;
  }
  const std::string e = errorOf(half, evalTransform(64, 64, 0));
  EXPECT_NE(e.find("corrupt JPEG"), std::string::npos) << e;
  // Cut inside the header: libjpeg's message.
  const Bytes header(jpeg.begin(), jpeg.begin() + 100);
  EXPECT_THROW(decode(header, train), DataError);
  // Intact header, corrupt data that still ends in an end-of-image marker:
  // libjpeg's warning becomes an error.
  Bytes cut(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  cut.push_back(0xFF);
  cut.push_back(0xD9);
  EXPECT_THROW(decode(cut, evalTransform(64, 64, 0)), DataError);

  const Bytes png = encodePng(smooth(300, 200));
  const Bytes pngHalf(png.begin(), png.begin() + png.size() / 2);
  EXPECT_NE(errorOf(pngHalf, evalTransform(64, 64, 0)).find("corrupt PNG"), std::string::npos);
}

// Output size equal to the input: the pixels come back (tolerance: JPEG's
// quantization at quality 100 with 4:4:4 chroma, up to 3/255 at a pixel,
// plus float rounding; PNG: exact).
TEST(Image, SameSizeDecodeReturnsTheSourcePixels) {
  const Pixels src = smooth(64, 64);
  const Diff j = diff(decode(encodeJpeg(src, 100), evalTransform(64, 64, 64)), src);
  EXPECT_LT(j.mean, 1.0 / 255);
  EXPECT_LE(j.max, 3.5 / 255);
  const Diff p = diff(decode(encodePng(src), evalTransform(64, 64, 64)), src);
  EXPECT_LT(p.max, 1e-6);
  // Non-square, through a RandomResizedCrop that must take the whole image.
  const Pixels wide = smooth(96, 40);
  ImageTransform t;
  t.randomResizedCrop = true;
  t.outHeight = 40;
  t.outWidth = 96;
  t.scaleMin = t.scaleMax = 1.0;
  t.ratioMin = t.ratioMax = 96.0 / 40;
  EXPECT_LT(diff(decode(encodePng(wide), t, 7), wide).max, 1e-6);
  EXPECT_LE(diff(decode(encodeJpeg(wide, 100), t, 7), wide).max, 3.5 / 255);
}

TEST(Image, ConstantColourStaysConstant) {
  const Pixels src = makePixels(301, 207, 3, [](int, int, int c) { return 200 - 70 * c; });
  ImageTransform t;
  t.randomResizedCrop = true;
  for (int64_t size : {16, 64, 224, 400}) {
    t.outHeight = t.outWidth = size;
    for (uint64_t seed = 0; seed < 3; ++seed) {
      const auto png = decode(encodePng(src), t, seed);
      const auto jpeg = decode(encodeJpeg(src, 95, TJSAMP_420), t, seed);
      const size_t plane = size_t(size * size);
      for (int c = 0; c < 3; ++c) {
        const float want = (200 - 70 * c) / 255.0f;
        for (size_t i = 0; i < plane; ++i) {
          ASSERT_NEAR(png[c * plane + i], want, 1e-5) << "size " << size << " c " << c;
          ASSERT_NEAR(jpeg[c * plane + i], want, 2.5 / 255) << "size " << size << " c " << c;
        }
      }
    }
  }
}

// An independent reference: PIL's antialiased bilinear in one dimension,
// written out in double precision.
std::vector<double> referenceResize(const std::vector<double>& in, int out) {
  const double scale = double(in.size()) / out;
  const double support = std::max(scale, 1.0);
  std::vector<double> r(size_t(out), 0.0);
  for (int i = 0; i < out; ++i) {
    const double center = (i + 0.5) * scale;
    double sum = 0, wsum = 0;
    for (int x = 0; x < int(in.size()); ++x) {
      const double w = std::max(0.0, 1.0 - std::fabs((x + 0.5 - center) / support));
      sum += w * in[size_t(x)];
      wsum += w;
    }
    r[size_t(i)] = sum / wsum;
  }
  return r;
}

TEST(Image, GradientResizeMatchesReference) {
  // Horizontal and vertical gradients in two channels, lossless (PNG).
  const int W = 240, H = 100;
  const Pixels src = makePixels(W, H, 3, [](int y, int x, int c) {
    return c == 0 ? x + 7 : c == 1 ? 2 * y + 20 : (x * x) % 256;
  });
  std::vector<double> row(W), col(H);
  for (int x = 0; x < W; ++x) row[size_t(x)] = (x + 7) / 255.0;
  for (int y = 0; y < H; ++y) col[size_t(y)] = (2 * y + 20) / 255.0;
  for (auto [outH, outW] : {std::pair{25, 60}, std::pair{100, 240}, std::pair{170, 400}}) {
    ImageTransform t;  // the whole image, resized to outH x outW
    t.randomResizedCrop = true;
    t.outHeight = outH;
    t.outWidth = outW;
    t.scaleMin = t.scaleMax = 1.0;
    t.ratioMin = t.ratioMax = double(W) / H;
    const auto out = decode(encodePng(src), t);
    const auto wantX = referenceResize(row, outW), wantY = referenceResize(col, outH);
    double worst = 0;
    for (int y = 0; y < outH; ++y) {
      for (int x = 0; x < outW; ++x) {
        worst = std::max(worst, std::fabs(out[size_t(y * outW + x)] - wantX[size_t(x)]));
        worst = std::max(worst, std::fabs(out[size_t(outH * outW + y * outW + x)] -
                                          wantY[size_t(y)]));
      }
    }
    EXPECT_LT(worst, 1e-5) << outH << "x" << outW;
  }
}

// A reduction by 4 or more decodes the JPEG at 1/2, 1/4 or 1/8 scale (IDCT
// scaling); on a smooth image it must agree with the full decode of the
// same pixels, here the lossless PNG of them (mean below 1/255, max 6/255).
TEST(Image, DctScaledDecodeAgreesWithFullDecode) {
  const Pixels src = smooth(512, 384);
  const Bytes jpeg = encodeJpeg(src, 98, TJSAMP_420), png = encodePng(src);
  for (int64_t size : {32, 64, 100}) {  // factors 12, 6, 3.8: 1/8, 1/4, 1/2
    for (bool train : {false, true}) {
      ImageTransform t = evalTransform(size, size, 0);
      t.randomResizedCrop = train;
      t.scaleMin = 0.5;
      for (uint64_t seed = 0; seed < 3; ++seed) {
        const auto a = decode(jpeg, t, seed), b = decode(png, t, seed);
        double mean = 0, max = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          mean += std::fabs(a[i] - b[i]);
          max = std::max(max, double(std::fabs(a[i] - b[i])));
        }
        mean /= double(a.size());
        EXPECT_LT(mean, 1.0 / 255) << "size " << size << " train " << train;
        EXPECT_LT(max, 6.0 / 255) << "size " << size << " train " << train;
      }
    }
  }
}

TEST(Image, RandomResizedCropIsDeterministicPerSeed) {
  const Bytes jpeg = encodeJpeg(smooth(500, 375), 90);
  ImageTransform t;
  t.randomResizedCrop = true;
  t.outHeight = t.outWidth = 64;
  EXPECT_EQ(decode(jpeg, t, 42), decode(jpeg, t, 42));
  std::set<std::vector<float>> distinct;
  for (uint64_t seed = 0; seed < 8; ++seed) distinct.insert(decode(jpeg, t, seed));
  EXPECT_EQ(distinct.size(), 8u);
}

// Each thread has its own scratch buffers: concurrent decodes of different
// images and sizes give what one thread gives.
TEST(Image, ThreadsDecodeIndependently) {
  const Bytes a = encodeJpeg(smooth(500, 375), 90, TJSAMP_420), b = encodePng(smooth(200, 300));
  ImageTransform t64, t224;
  t64.randomResizedCrop = true;
  t64.outHeight = t64.outWidth = 64;
  t224.outHeight = t224.outWidth = 224;
  const auto wantA = decode(a, t64, 5), wantB = decode(b, t224, 6);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 20; ++k) {
        if (i % 2 == 0 ? decode(a, t64, 5) != wantA : decode(b, t224, 6) != wantB) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Image, RandomResizedCropBoxStaysInsideWithTheRequestedShape) {
  ImageTransform t;
  int fallbacks = 0;
  for (auto [h, w] : {std::pair<int64_t, int64_t>{375, 500}, {500, 375}, {20, 1000}, {1, 1},
                      {224, 224}, {3, 7}}) {
    for (uint64_t seed = 0; seed < 500; ++seed) {
      const CropBox b = randomResizedCropBox(h, w, t, seed);
      ASSERT_GE(b.top, 0);
      ASSERT_GE(b.left, 0);
      ASSERT_GE(b.height, 1);
      ASSERT_GE(b.width, 1);
      ASSERT_LE(b.top + b.height, h) << h << "x" << w << " seed " << seed;
      ASSERT_LE(b.left + b.width, w) << h << "x" << w << " seed " << seed;
      const double area = double(b.height * b.width) / double(h * w);
      const double ratio = double(b.width) / double(b.height);
      if (h >= 224 && w >= 224) {  // big enough for rounding not to matter
        EXPECT_GT(area, 0.08 * 0.95);
        EXPECT_GT(ratio, 0.75 * 0.97);
        EXPECT_LT(ratio, 4.0 / 3 * 1.03);
      }
      if (h == 20) {
        // 50:1 never fits a 4:3 crop of 8% of the area in 10 draws... often:
        // the fallback is the centered, ratio-clamped crop.
        if (b.height == 20 && b.width == 27) {
          ++fallbacks;
          EXPECT_EQ(b.left, (1000 - 27) / 2);
        }
      }
    }
  }
  EXPECT_GT(fallbacks, 0);
  // The same seed gives the same box; different seeds spread over the image.
  EXPECT_EQ(randomResizedCropBox(375, 500, t, 3).left, randomResizedCropBox(375, 500, t, 3).left);
  std::set<int64_t> lefts;
  for (uint64_t seed = 0; seed < 50; ++seed) lefts.insert(randomResizedCropBox(375, 500, t, seed).left);
  EXPECT_GT(lefts.size(), 30u);
}

TEST(Image, GrayAndColourConvert) {
  const Pixels gray = makePixels(80, 60, 1, [](int y, int x, int) { return 40 + x + y; });
  for (const Bytes& b : {encodeJpeg(gray, 100), encodePng(gray)}) {
    const auto out = decode(b, evalTransform(60, 60, 60));
    const size_t plane = 60 * 60;
    for (size_t i = 0; i < plane; ++i) {
      ASSERT_EQ(out[i], out[plane + i]);
      ASSERT_EQ(out[i], out[2 * plane + i]);
    }
  }
  // RGB to one channel: luma (ITU-R 601 weights, as PIL's "L").
  const Pixels rgb = smooth(64, 64);
  const Pixels luma = makePixels(64, 64, 1, [&](int y, int x, int) {
    const Pixels& p = rgb;
    const uint8_t* s = &p.data[(size_t(y) * 64 + x) * 3];
    return std::lround(0.299 * s[0] + 0.587 * s[1] + 0.114 * s[2]);
  });
  EXPECT_LE(diff(decode(encodePng(rgb), evalTransform(64, 64, 64, 1)), luma).max, 1.0 / 255);
  EXPECT_LE(diff(decode(encodeJpeg(rgb, 100), evalTransform(64, 64, 64, 1)), luma).max,
            3.0 / 255);
  // RGBA and gray+alpha PNGs: alpha is dropped, as PIL's convert("RGB") does.
  const Pixels rgba = makePixels(32, 32, 4, [](int y, int x, int c) {
    return c == 3 ? 128 : c == 0 ? 8 * x : c == 1 ? 8 * y : 77;
  });
  const auto out = decode(encodePng(rgba), evalTransform(32, 32, 32));
  EXPECT_NEAR(out[5 * 32 + 3], 8 * 3 / 255.0, 1e-6);
  EXPECT_NEAR(out[32 * 32 + 5 * 32 + 3], 8 * 5 / 255.0, 1e-6);
  EXPECT_NEAR(out[2 * 32 * 32 + 9], 77 / 255.0, 1e-6);
}

TEST(Image, CmykJpegBecomesRgb) {
  // libjpeg writes CMYK with an Adobe marker: stored values are inverted ink,
  // R = C * K / 255 (as PIL reads Adobe CMYK).
  const Pixels cmyk = makePixels(32, 32, 4, [](int, int, int c) {
    return c == 0 ? 255 : c == 1 ? 128 : c == 2 ? 0 : 255;
  });
  const auto out = decode(encodeJpeg(cmyk, 100), evalTransform(16, 16, 16));
  EXPECT_NEAR(out[0], 1.0, 2.0 / 255);
  EXPECT_NEAR(out[256], 128 / 255.0, 2.0 / 255);
  EXPECT_NEAR(out[512], 0.0, 2.0 / 255);
}

TEST(Image, EvalTakesTheCenterOfTheResizedImage) {
  // Left half dark, right half bright, 2:1: after Resize(32) the center 32x32
  // crop straddles the edge in its middle.
  const Pixels src = makePixels(128, 64, 1, [](int, int x, int) { return x < 64 ? 0 : 255; });
  const auto out = decode(encodePng(src), evalTransform(32, 32, 32, 1));
  EXPECT_NEAR(out[0], 0.0, 1e-6);
  EXPECT_NEAR(out[31], 1.0, 1e-6);
  EXPECT_NEAR(out[15] + out[16], 1.0, 1e-5);  // symmetric around the edge
}

TEST(Image, InvalidTransformIsAConfigError) {
  ImageTransform t;
  t.channels = 2;
  EXPECT_THROW(t.validate(), ConfigError);
  t = ImageTransform{};
  t.scaleMin = 0;
  EXPECT_THROW(t.validate(), ConfigError);
  t = ImageTransform{};
  t.resizeShorter = 100;
  EXPECT_THROW(t.validate(), ConfigError);
  EXPECT_NO_THROW(ImageTransform{}.validate());
}

// ---- Against torchvision, on the same JPEG file ----

class ImageVsTorchvision : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(test::pythonImports("torchvision, PIL"));
    // A photo-like 500x375 image with 4:2:0 chroma, as ImageNet's.
    const Pixels src = makePixels(500, 375, 3, [](int y, int x, int c) {
      const double v = 128 + 60 * std::sin(x * 0.05 + c) * std::cos(y * 0.03) +
                       40 * std::sin((x + 2 * y) * 0.21 + c * 2) + ((x * 7 + y * 13 + c) % 17);
      return std::lround(std::clamp(v, 0.0, 255.0));
    });
    jpeg_ = encodeJpeg(src, 90, TJSAMP_420);
    std::ofstream(dir_.file("img.jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(jpeg_.data()), std::streamsize(jpeg_.size()));
  }

  // torchvision's outputs for `specs` (see torchvision_transforms.py), each
  // `numel` floats.
  std::vector<std::vector<float>> torchvision(const std::vector<std::string>& specs,
                                              size_t numel) {
    std::vector<std::string> argv = {COHORT_PYTHON,
                                     test::sourceDir() + "/tests/data/torchvision_transforms.py",
                                     dir_.file("img.jpg"), dir_.file("out.f32")};
    argv.insert(argv.end(), specs.begin(), specs.end());
    auto r = test::run(argv, {}, std::chrono::minutes(2));
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    std::vector<std::vector<float>> out(specs.size(), std::vector<float>(numel));
    std::ifstream in(dir_.file("out.f32"), std::ios::binary);
    for (auto& o : out) {
      in.read(reinterpret_cast<char*>(o.data()), std::streamsize(numel * sizeof(float)));
    }
    EXPECT_TRUE(in.good()) << "short output from " << argv[1];
    return out;
  }

  static Diff compare(const std::vector<float>& a, const std::vector<float>& b) {
    Diff d;
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      d.mean += std::fabs(a[i] - b[i]);
      d.max = std::max(d.max, double(std::fabs(a[i] - b[i])));
    }
    d.mean /= double(std::max<size_t>(1, a.size()));
    return d;
  }

  test::TempDir dir_;
  Bytes jpeg_;
};

// Resize(256) + CenterCrop(224) + ToTensor: the same libjpeg-turbo decode
// and PIL's filter; the difference is PIL's rounding to 8 bits after each
// resize pass and its fixed-point weights (measured: mean 0.29/255, max
// 2.6/255).
TEST_F(ImageVsTorchvision, EvalMatchesResizeCenterCrop) {
  const auto theirs = torchvision({"eval:256:224"}, 3 * 224 * 224);
  const Diff d = compare(decode(jpeg_, evalTransform(224, 224, 256)), theirs[0]);
  RecordProperty("mean_abs_diff", std::to_string(d.mean));
  EXPECT_LT(d.mean, 0.5 / 255) << "max " << d.max;
  EXPECT_LT(d.max, 4.0 / 255);
}

// torchvision's resized_crop of the box RandomResizedCrop chose for a seed.
// At 224 the crop is decoded at full scale: as close as eval. At 64 it is
// decoded at 1/2 or 1/4 scale (DCT scaling) where torchvision filters the
// full decode: mean below 2/255 on this high-frequency image (measured 1.3).
TEST_F(ImageVsTorchvision, RandomResizedCropMatchesResizedCropOfTheSameBox) {
  for (int64_t size : {224, 64}) {
    ImageTransform t;
    t.randomResizedCrop = true;
    t.outHeight = t.outWidth = size;
    std::vector<std::string> specs;
    const std::vector<uint64_t> seeds = {1, 2, 3, 4};
    for (uint64_t seed : seeds) {
      const CropBox b = randomResizedCropBox(375, 500, t, seed);
      specs.push_back(fmt::format("crop:{}:{}:{}:{}:{}", b.top, b.left, b.height, b.width, size));
    }
    const auto theirs = torchvision(specs, size_t(3 * size * size));
    for (size_t i = 0; i < seeds.size(); ++i) {
      const Diff d = compare(decode(jpeg_, t, seeds[i]), theirs[i]);  // the same box
      RecordProperty(fmt::format("mean_abs_diff_{}_seed{}", size, seeds[i]), std::to_string(d.mean));
      EXPECT_LT(d.mean, (size == 224 ? 0.5 : 2.0) / 255) << specs[i] << " max " << d.max;
    }
  }
}

}  // namespace
}  // namespace cohort::data
