#pragma once

// Separable bilinear resampling with PIL's antialiasing: when reducing by a
// factor f, the triangle filter is stretched to a support of f source pixels
// on each side, so every source pixel contributes (area-averaging-like);
// when enlarging it is plain bilinear interpolation. The weights follow PIL's
// ImagingResample (Resample.c: precompute_coeffs) so results match
// torchvision's Resize on PIL images up to PIL's 8-bit rounding.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cohort::data::detail {

// The filter taps of one axis: output pixel i reads source pixels
// first[i] .. first[i] + count[i] - 1 with weights[i * taps + k].
struct ResizeAxis {
  std::vector<int32_t> first;
  std::vector<int32_t> count;
  std::vector<float> weights;
  int32_t taps = 0;
  int32_t size() const { return static_cast<int32_t>(first.size()); }
  // The source pixels read: [lo(), hi()).
  int32_t lo() const;
  int32_t hi() const;
  // Moves the taps when the source buffer starts `by` pixels later.
  void shift(int32_t by);
  void scaleWeights(float factor);
};

// The taps of output pixels offset .. offset + count - 1 of a resize whose
// output pixel o has its center at source coordinate in0 + (o + 0.5) * scale
// (scale: source pixels per output pixel). Only source pixels in [lo, hi)
// are read: the edge of a crop, or of the image, clamps the filter there.
void computeResizeAxis(double in0, double scale, int64_t offset, int64_t count, int64_t lo,
                       int64_t hi, ResizeAxis* axis);

// Resamples interleaved 8-bit pixels into channel-major floats: the axes
// index `src` (rows of `stride` bytes, `pixelBytes` bytes per pixel of which
// the first `channels` are used; shift() them when the buffer holds only a
// region of the image), and `out` receives
// channels x y.size() x x.size() floats, source value times the weights (fold
// 1/255 into them with scaleWeights). `pixelBytes`/`channels` pairs
// supported: 1/1, 2/1, 3/3, 4/3.
void resizeToPlanar(const uint8_t* src, size_t stride, int pixelBytes, int channels,
                    const ResizeAxis& x, const ResizeAxis& y, float* out);

}  // namespace cohort::data::detail
