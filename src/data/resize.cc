// Antialiased bilinear resampling (see detail/resize.h). Two passes over a
// thread-local float buffer: horizontal over the source rows the vertical
// taps read, writing channel-major rows; then vertical, whose inner loop runs
// along contiguous output rows and vectorizes.

#include "data/detail/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cohort/core/error.h"

namespace cohort::data::detail {
namespace {

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Four floats in one SSE register (GCC/Clang vector extension).
typedef float Float4 __attribute__((vector_size(16)));

// Horizontal pass. Each source row is first widened to floats (a loop the
// compiler vectorizes); then, for RGB, each tap is one 4-lane multiply-add
// of pixel k's three channels (and a fourth value that is ignored), instead
// of three scalar conversions, multiplies and adds.
template <int kPixelBytes, int kChannels>
void horizontalPass(const uint8_t* src, size_t stride, int32_t rowLo, int32_t rows,
                    const ResizeAxis& x, float* tmp) {
  static thread_local std::vector<float> wide;
  const int32_t outW = x.size();
  const int32_t taps = x.taps;
  const int32_t* first = x.first.data();
  const int32_t* count = x.count.data();
  const float* weights = x.weights.data();
  const int32_t colLo = x.lo();
  const size_t values = static_cast<size_t>(x.hi() - colLo) * kPixelBytes;
  wide.resize(values + 4);  // + 4: the ignored lane of the last pixel
  float* w4 = wide.data();
  std::fill(w4 + values, w4 + values + 4, 0.0f);
  for (int32_t r = 0; r < rows; ++r) {
    const uint8_t* row = src + static_cast<size_t>(rowLo + r) * stride +
                         static_cast<size_t>(colLo) * kPixelBytes;
    for (size_t i = 0; i < values; ++i) w4[i] = static_cast<float>(row[i]);
    float* dst[kChannels];
    for (int c = 0; c < kChannels; ++c) {
      dst[c] = tmp + (static_cast<size_t>(c) * rows + r) * outW;
    }
    for (int32_t o = 0; o < outW; ++o) {
      const float* p = w4 + static_cast<size_t>(first[o] - colLo) * kPixelBytes;
      const float* w = weights + static_cast<size_t>(o) * taps;
      if constexpr (kChannels == 3) {
        Float4 acc = {0, 0, 0, 0};
        for (int32_t k = 0; k < count[o]; ++k) {
          Float4 v;
          std::memcpy(&v, p, sizeof(v));
          acc += w[k] * v;
          p += kPixelBytes;
        }
        dst[0][o] = acc[0];
        dst[1][o] = acc[1];
        dst[2][o] = acc[2];
      } else {
        float acc = 0;
        for (int32_t k = 0; k < count[o]; ++k) acc += w[k] * p[k * kPixelBytes];
        dst[0][o] = acc;
      }
    }
  }
}

}  // namespace

int32_t ResizeAxis::lo() const {
  return first.empty() ? 0 : *std::min_element(first.begin(), first.end());
}

int32_t ResizeAxis::hi() const {
  int32_t h = 0;
  for (size_t i = 0; i < first.size(); ++i) h = std::max(h, first[i] + count[i]);
  return h;
}

void ResizeAxis::shift(int32_t by) {
  for (int32_t& f : first) f -= by;
}

void ResizeAxis::scaleWeights(float factor) {
  for (float& w : weights) w *= factor;
}

void computeResizeAxis(double in0, double scale, int64_t offset, int64_t count, int64_t lo,
                       int64_t hi, ResizeAxis* axis) {
  COHORT_ASSERT(count > 0 && scale > 0 && lo < hi, "count ", count, " scale ", scale, " lo ",
                lo, " hi ", hi);
  const double filterScale = std::max(scale, 1.0);
  const double support = 1.0 * filterScale;  // the triangle's support is 1
  const double invFilterScale = 1.0 / filterScale;
  const int32_t taps = static_cast<int32_t>(std::ceil(support)) * 2 + 1;
  axis->taps = taps;
  axis->first.assign(static_cast<size_t>(count), 0);
  axis->count.assign(static_cast<size_t>(count), 0);
  axis->weights.assign(static_cast<size_t>(count) * taps, 0.0f);
  double w[64];
  COHORT_ASSERT(taps <= 64, "resize factor ", scale, " too large");
  for (int64_t i = 0; i < count; ++i) {
    const double center = in0 + (static_cast<double>(offset + i) + 0.5) * scale;
    // As PIL: bounds rounded with a C cast, then clamped.
    int64_t xmin = static_cast<int64_t>(center - support + 0.5);
    int64_t xmax = static_cast<int64_t>(center + support + 0.5);
    xmin = std::clamp(xmin, lo, hi - 1);
    xmax = std::clamp(xmax, xmin + 1, hi);
    double total = 0;
    int n = 0;
    for (int64_t x = xmin; x < xmax && n < taps; ++x, ++n) {
      w[n] = triangle((static_cast<double>(x) + 0.5 - center) * invFilterScale);
      total += w[n];
    }
    // Drop zero weights at both ends: fewer taps to run.
    int begin = 0;
    while (begin < n - 1 && w[begin] == 0.0) ++begin;
    while (n - 1 > begin && w[n - 1] == 0.0) --n;
    if (total == 0.0) {  // the clamped window missed the filter: nearest pixel
      w[begin] = 1.0;
      total = 1.0;
      n = begin + 1;
    }
    axis->first[static_cast<size_t>(i)] = static_cast<int32_t>(xmin + begin);
    axis->count[static_cast<size_t>(i)] = n - begin;
    float* dst = axis->weights.data() + static_cast<size_t>(i) * taps;
    for (int k = begin; k < n; ++k) dst[k - begin] = static_cast<float>(w[k] / total);
  }
}

void resizeToPlanar(const uint8_t* src, size_t stride, int pixelBytes, int channels,
                    const ResizeAxis& x, const ResizeAxis& y, float* out) {
  static thread_local std::vector<float> scratch;
  const int32_t rowLo = y.lo();
  const int32_t rows = y.hi() - rowLo;
  const int32_t outW = x.size(), outH = y.size();
  scratch.resize(static_cast<size_t>(channels) * rows * outW);
  float* tmp = scratch.data();
  if (pixelBytes == 3 && channels == 3) {
    horizontalPass<3, 3>(src, stride, rowLo, rows, x, tmp);
  } else if (pixelBytes == 1 && channels == 1) {
    horizontalPass<1, 1>(src, stride, rowLo, rows, x, tmp);
  } else if (pixelBytes == 4 && channels == 3) {
    horizontalPass<4, 3>(src, stride, rowLo, rows, x, tmp);
  } else if (pixelBytes == 2 && channels == 1) {
    horizontalPass<2, 1>(src, stride, rowLo, rows, x, tmp);
  } else {
    COHORT_ASSERT(false, "unsupported pixel layout: ", pixelBytes, " bytes, ", channels,
                  " channels");
  }
  for (int c = 0; c < channels; ++c) {
    const float* plane = tmp + static_cast<size_t>(c) * rows * outW;
    for (int32_t o = 0; o < outH; ++o) {
      float* __restrict dst = out + (static_cast<size_t>(c) * outH + o) * outW;
      const float* w = y.weights.data() + static_cast<size_t>(o) * y.taps;
      const float* __restrict row = plane + static_cast<size_t>(y.first[o] - rowLo) * outW;
      const float w0 = w[0];
      for (int32_t i = 0; i < outW; ++i) dst[i] = w0 * row[i];
      for (int32_t k = 1; k < y.count[o]; ++k) {
        const float wk = w[k];
        row += outW;
        for (int32_t i = 0; i < outW; ++i) dst[i] += wk * row[i];
      }
    }
  }
}

}  // namespace cohort::data::detail
