// decodeImage in three steps:
//  1. geometry: the crop (random or center) as a resize of the full-resolution
//     image, per axis: where output pixel 0 sits in the source, how many
//     source pixels one output pixel spans, and which source pixels the
//     filter may read (a RandomResizedCrop reads only inside its crop, as
//     torchvision crops before it resizes);
//  2. a JPEG is decoded at the smallest DCT scale (1/8, 1/4, 1/2) at which
//     every output pixel still spans at least one decoded pixel, and only in
//     the region the filter taps read; a PNG is decoded whole;
//  3. one separable resize from the decoded 8-bit pixels to the output floats.

#include "cohort/data/image.h"

#include <fmt/format.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "cohort/core/error.h"
#include "data/detail/jpeg.h"
#include "data/detail/random.h"
#include "data/detail/resize.h"

namespace cohort::data {
namespace {

// Decorrelates the crop from the flip applyTransform draws from the same seed.
constexpr uint64_t kCropStream = 0x6372'6f70'5f72'7263ull;

// Bounds the memory a decode may take (a PNG is decoded whole: up to 1 GB
// here), against a corrupt or hostile header. PIL warns from 89 Mpixels.
constexpr int64_t kMaxPixels = int64_t{1} << 28;

bool isPng(const uint8_t* data, size_t size) {
  static const uint8_t kMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return size >= 8 && std::memcmp(data, kMagic, 8) == 0;
}

[[noreturn]] void notAnImage(const uint8_t* data, size_t size) {
  std::string head;
  for (size_t i = 0; i < std::min<size_t>(size, 4); ++i) head += fmt::format(" {:02x}", data[i]);
  throw DataError(fmt::format("not a JPEG or PNG image ({} bytes, starting{})", size,
                              size == 0 ? " with nothing" : head));
}

// Uniform in [0, 1) with 53 bits.
double uniform(detail::Rng& rng) { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; }

// Python's round(): half to even (the default floating-point rounding mode).
int64_t roundHalfEven(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// One axis of a crop + resize in source pixels (see computeResizeAxis).
struct AxisGeometry {
  double in0 = 0, scale = 1;
  int64_t offset = 0, lo = 0, hi = 0;
};

// libpng's simplified API; frees its state on destruction.
struct PngImage {
  png_image image;
  PngImage(const uint8_t* data, size_t size) {
    std::memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&image, data, size)) fail();
    // Interpret 16-bit data without gamma information as sRGB, as PIL does.
    image.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
  }
  ~PngImage() { png_image_free(&image); }
  [[noreturn]] void fail() {
    throw DataError(fmt::format("corrupt PNG: {}", image.message));
  }
};

// Decodes a PNG whole: 1 byte per pixel (gray), 2 (gray + alpha, alpha
// ignored), 3 (RGB) or 4 (RGBA, alpha ignored), as PIL's convert() drops it.
// A colour image wanted as gray is converted with PIL's "L" weights.
detail::DecodedRegion decodePng(const uint8_t* data, size_t size, bool gray,
                                std::vector<uint8_t>* buffer) {
  PngImage png(data, size);
  const bool color = png.image.format & PNG_FORMAT_FLAG_COLOR;
  const bool alpha = png.image.format & PNG_FORMAT_FLAG_ALPHA;
  png.image.format = color ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB)
                           : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
  const int pixelBytes = static_cast<int>(PNG_IMAGE_PIXEL_SIZE(png.image.format));
  buffer->resize(PNG_IMAGE_SIZE(png.image));
  if (!png_image_finish_read(&png.image, nullptr, buffer->data(), 0, nullptr)) png.fail();
  detail::DecodedRegion r;
  r.pixels = buffer->data();
  r.pixelBytes = pixelBytes;
  r.height = png.image.height;
  r.width = png.image.width;
  r.stride = static_cast<size_t>(r.width) * pixelBytes;
  if (gray && color) {
    // In place: pixel i's gray byte is written at or before where it is read.
    uint8_t* p = buffer->data();
    const size_t n = static_cast<size_t>(r.width) * static_cast<size_t>(r.height);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* s = p + i * pixelBytes;
      p[i] = static_cast<uint8_t>((s[0] * 19595 + s[1] * 38470 + s[2] * 7471 + 0x8000) >> 16);
    }
    r.pixelBytes = 1;
    r.stride = static_cast<size_t>(r.width);
  }
  return r;
}

}  // namespace

void ImageTransform::validate() const {
  if (outHeight < 1 || outWidth < 1) {
    throw ConfigError(fmt::format("image transform: output size {}x{} must be at least 1x1",
                                  outHeight, outWidth));
  }
  if (channels != 1 && channels != 3) {
    throw ConfigError(fmt::format("image transform: channels = {}, expected 1 or 3", channels));
  }
  if (!(0 < scaleMin && scaleMin <= scaleMax && scaleMax <= 1)) {
    throw ConfigError(fmt::format("image transform: crop scale range [{}, {}] must satisfy "
                                  "0 < min <= max <= 1",
                                  scaleMin, scaleMax));
  }
  if (!(0 < ratioMin && ratioMin <= ratioMax)) {
    throw ConfigError(fmt::format("image transform: crop ratio range [{}, {}] must satisfy "
                                  "0 < min <= max",
                                  ratioMin, ratioMax));
  }
  if (resizeShorter != 0 && resizeShorter < std::max(outHeight, outWidth)) {
    throw ConfigError(fmt::format("image transform: resize_shorter = {} is below the {}x{} "
                                  "center crop",
                                  resizeShorter, outHeight, outWidth));
  }
}

ImageInfo probeImage(const uint8_t* data, size_t size) {
  if (detail::isJpeg(data, size)) return detail::JpegDecoder(data, size).info();
  if (isPng(data, size)) {
    PngImage png(data, size);
    ImageInfo info;
    info.height = png.image.height;
    info.width = png.image.width;
    info.channels = PNG_IMAGE_SAMPLE_CHANNELS(png.image.format);
    info.format = "png";
    return info;
  }
  notAnImage(data, size);
}

CropBox randomResizedCropBox(int64_t height, int64_t width, const ImageTransform& t,
                             uint64_t seed) {
  detail::Rng rng(detail::mix(seed, kCropStream));
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double logRatioMin = std::log(t.ratioMin), logRatioMax = std::log(t.ratioMax);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (t.scaleMin + (t.scaleMax - t.scaleMin) * uniform(rng));
    const double ratio = std::exp(logRatioMin + (logRatioMax - logRatioMin) * uniform(rng));
    const int64_t w = roundHalfEven(std::sqrt(target * ratio));
    const int64_t h = roundHalfEven(std::sqrt(target / ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      CropBox box;
      box.top = static_cast<int64_t>(rng.below(static_cast<uint64_t>(height - h + 1)));
      box.left = static_cast<int64_t>(rng.below(static_cast<uint64_t>(width - w + 1)));
      box.height = h;
      box.width = w;
      return box;
    }
  }
  // Fallback: the center crop, its aspect ratio clamped to the range.
  CropBox box{0, 0, height, width};
  const double inRatio = static_cast<double>(width) / static_cast<double>(height);
  if (inRatio < t.ratioMin) {
    box.height = std::clamp<int64_t>(roundHalfEven(width / t.ratioMin), 1, height);
  } else if (inRatio > t.ratioMax) {
    box.width = std::clamp<int64_t>(roundHalfEven(height * t.ratioMax), 1, width);
  }
  box.top = (height - box.height) / 2;
  box.left = (width - box.width) / 2;
  return box;
}

namespace {

// decodeImage and decodeImageCrop: `box` is the crop, or null for
// t.randomResizedCrop's (drawn from `seed`) or eval's.
void decode(const uint8_t* data, size_t size, const ImageTransform& t, const CropBox* box,
            uint64_t seed, float* out) {
  t.validate();
  const bool jpeg = detail::isJpeg(data, size);
  if (!jpeg && !isPng(data, size)) notAnImage(data, size);

  // Scratch reused by this thread's next image: no allocation per image.
  static thread_local std::vector<uint8_t> pixels;
  static thread_local detail::ResizeAxis axisX, axisY;

  // A JPEG's header is read once, by the decoder that decodes it.
  std::optional<detail::JpegDecoder> decoder;
  ImageInfo info;
  if (jpeg) {
    decoder.emplace(data, size);
    info = decoder->info();
  } else {
    info = probeImage(data, size);
  }
  const int64_t H = info.height, W = info.width;
  if (H * W > kMaxPixels) {
    throw DataError(fmt::format("{} image of {}x{} pixels is larger than the limit of {} pixels",
                                info.format, H, W, kMaxPixels));
  }

  // 1. Geometry in full-resolution source pixels.
  AxisGeometry gx, gy;
  if (box != nullptr || t.randomResizedCrop) {
    const CropBox b = box != nullptr ? *box : randomResizedCropBox(H, W, t, seed);
    if (b.top < 0 || b.left < 0 || b.height < 1 || b.width < 1 || b.top + b.height > H ||
        b.left + b.width > W) {
      throw DataError(fmt::format("crop {}x{} at ({}, {}) is not inside the {}x{} image",
                                  b.height, b.width, b.top, b.left, H, W));
    }
    gx = {static_cast<double>(b.left), static_cast<double>(b.width) / t.outWidth, 0, b.left,
          b.left + b.width};
    gy = {static_cast<double>(b.top), static_cast<double>(b.height) / t.outHeight, 0, b.top,
          b.top + b.height};
  } else {
    // torchvision's Resize(shorter): the longer side truncated, then
    // CenterCrop's offsets rounded half to even.
    const int64_t shorter =
        t.resizeShorter > 0
            ? t.resizeShorter
            : static_cast<int64_t>(std::floor(std::max(t.outHeight, t.outWidth) / 0.875 + 1e-9));
    int64_t newH = shorter, newW = shorter;
    if (W <= H) {
      newH = static_cast<int64_t>(static_cast<double>(shorter) * H / W);
    } else {
      newW = static_cast<int64_t>(static_cast<double>(shorter) * W / H);
    }
    gx = {0.0, static_cast<double>(W) / newW, roundHalfEven((newW - t.outWidth) / 2.0), 0, W};
    gy = {0.0, static_cast<double>(H) / newH, roundHalfEven((newH - t.outHeight) / 2.0), 0, H};
  }

  // 2. DCT scale: the largest 1/d with every output pixel still spanning at
  // least one decoded pixel.
  int denom = 1;
  if (jpeg) {
    while (denom < 8 && gx.scale >= 2 * denom && gy.scale >= 2 * denom) denom *= 2;
  }
  auto axis = [&](const AxisGeometry& g, int64_t count, int64_t full, detail::ResizeAxis* a) {
    const int64_t scaledFull = detail::JpegDecoder::scaledSize(full, denom);
    const int64_t lo = std::min(g.lo / denom, scaledFull - 1);
    const int64_t hi = std::clamp<int64_t>((g.hi + denom - 1) / denom, lo + 1, scaledFull);
    detail::computeResizeAxis(g.in0 / denom, g.scale / denom, g.offset, count, lo, hi, a);
  };
  axis(gx, t.outWidth, W, &axisX);
  axis(gy, t.outHeight, H, &axisY);

  const bool gray = t.channels == 1;
  detail::DecodedRegion region =
      jpeg ? decoder->decode(denom, gray, axisY.lo(), axisY.hi(), axisX.lo(), axisX.hi(), &pixels)
           : decodePng(data, size, gray, &pixels);
  axisX.shift(static_cast<int32_t>(region.left));
  axisY.shift(static_cast<int32_t>(region.top));
  axisY.scaleWeights(1.0f / 255.0f);

  // 3. Resize; a gray image wanted in RGB is resized once and copied.
  const int sourceChannels = region.pixelBytes >= 3 ? 3 : 1;
  detail::resizeToPlanar(region.pixels, region.stride, region.pixelBytes, sourceChannels, axisX,
                         axisY, out);
  if (t.channels == 3 && sourceChannels == 1) {
    const size_t plane = static_cast<size_t>(t.outHeight) * static_cast<size_t>(t.outWidth);
    std::memcpy(out + plane, out, plane * sizeof(float));
    std::memcpy(out + 2 * plane, out, plane * sizeof(float));
  }
}

}  // namespace

void decodeImage(const uint8_t* data, size_t size, const ImageTransform& t, uint64_t seed,
                 float* out) {
  decode(data, size, t, nullptr, seed, out);
}

void decodeImageCrop(const uint8_t* data, size_t size, const CropBox& box,
                     const ImageTransform& t, float* out) {
  decode(data, size, t, &box, 0, out);
}

}  // namespace cohort::data
