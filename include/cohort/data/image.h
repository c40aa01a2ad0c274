#pragma once

// Decoding of JPEG and PNG images straight into the float pixels a model
// reads, cropped and resized the way torchvision's ImageNet transforms do:
//
//   training: RandomResizedCrop(out)              -> decodeImage(randomResizedCrop = true)
//   eval:     Resize(shorter) + CenterCrop(out)   -> decodeImage(randomResizedCrop = false)
//
// followed by ToTensor (pixels / 255, channel-major). Horizontal flip and
// normalization are applyTransform's (transform.h), on decodeImage's output.
//
// Speed comes from decoding only what the crop needs: a JPEG is decoded at
// 1/2, 1/4 or 1/8 scale (DCT scaling) when the crop, so reduced, still has at
// least the output's size, and only the rows and block columns the resize
// reads. docs/data.md ("Decoding and transforms") has the details.
//
// All functions are thread-safe; each thread reuses its own scratch buffers.

#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort::data {

struct ImageInfo {
  int64_t height = 0, width = 0;
  int64_t channels = 0;  // in the file: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA or CMYK
  std::string format;    // "jpeg" | "png"
};

// Reads only the header. Throws DataError ("not a JPEG or PNG image", or the
// decoder's message) for bytes that do not start with a decodable header.
ImageInfo probeImage(const uint8_t* data, size_t size);

struct ImageTransform {
  int64_t outHeight = 224, outWidth = 224;
  int64_t channels = 3;           // 3: RGB, 1: grayscale (luma) output
  bool randomResizedCrop = false; // training: Inception-style random crop
  double scaleMin = 0.08, scaleMax = 1.0;         // crop area, fraction of the image's
  double ratioMin = 3.0 / 4, ratioMax = 4.0 / 3;  // crop aspect ratio w/h (log-uniform)
  int64_t resizeShorter = 0;  // eval: shorter side resized to this (0: outHeight / 0.875,
                              // i.e. 256 for 224), then the center outHeight x outWidth kept
  // Throws ConfigError for sizes below 1, channels not 1 or 3, empty or
  // inverted scale/ratio ranges.
  void validate() const;
};

// A rectangle of the source image in its full-resolution pixels.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// The crop RandomResizedCrop takes from an image of `height` x `width` for
// `seed`, exactly as torchvision defines it: up to 10 draws of an area in
// [scaleMin, scaleMax] x the image's area and a log-uniform aspect ratio in
// [ratioMin, ratioMax] (rounded half to even, as Python does), the first
// that fits placed uniformly; else the center crop with the ratio clamped.
// Random numbers come from cohort's portable RNG, so a seed gives the same
// crop on every machine (not the same crop as torch's generator would), and
// the crop decodeImage takes for the same seed. The draws are independent
// of applyTransform's flip for the same seed.
CropBox randomResizedCropBox(int64_t height, int64_t width, const ImageTransform& t,
                             uint64_t seed);

// Decodes a JPEG or PNG, crops and resizes it as `t` says and writes
// channel-major floats in [0, 1] (t.channels x t.outHeight x t.outWidth) to
// `out`. The resize is bilinear, antialiased when reducing (PIL's filter, as
// torchvision uses on PIL images). Random choices depend only on `seed`.
// Throws DataError for corrupt or truncated image bytes (the caller adds the
// record's key); a JPEG whose decoder warns (e.g. premature end of data) is
// corrupt too. Throws ConfigError for an invalid `t`.
void decodeImage(const uint8_t* data, size_t size, const ImageTransform& t, uint64_t seed,
                 float* out);

// The same for a crop the caller chose (torchvision's resized_crop): `box`
// (inside the image) resized to t.outHeight x t.outWidth; t.randomResizedCrop
// and the eval fields are ignored.
void decodeImageCrop(const uint8_t* data, size_t size, const CropBox& box,
                     const ImageTransform& t, float* out);

}  // namespace cohort::data
