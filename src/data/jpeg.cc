// libjpeg's errors arrive through error_exit, which must not return: it
// longjmps back to the JpegDecoder method that called libjpeg, which throws.
// Between setjmp and a libjpeg call no object with a destructor is created,
// so the longjmp skips nothing that needs one.

#include "data/detail/jpeg.h"

#include <fmt/format.h>

#include <cstring>

#include "cohort/core/error.h"

namespace cohort::data::detail {
namespace {

[[noreturn]] void throwJpeg(const char* message) {
  throw DataError(fmt::format("corrupt JPEG: {}", message));
}

// Whether an end-of-image marker follows the first scan. Entropy-coded data
// never holds FF D9 (a coded FF is followed by 00 or a restart marker), so a
// file cut short anywhere after its header fails this. decode() stops
// reading after the crop's last row, and libjpeg would not notice a missing
// tail by itself.
bool hasEndOfImage(const uint8_t* data, size_t size) {
  size_t pos = 2;
  size_t scan = 0;
  while (pos + 4 <= size) {
    if (data[pos] != 0xFF) return false;
    const uint8_t marker = data[pos + 1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0xDA) {
      scan = pos;
      break;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
      pos += 2;
      continue;
    }
    pos += 2 + ((size_t{data[pos + 2]} << 8) | data[pos + 3]);
  }
  if (scan == 0) return false;
  for (size_t i = size - 1; i > scan + 1; --i) {
    if (data[i] == 0xD9 && data[i - 1] == 0xFF) return true;
  }
  return false;
}

// Adobe CMYK JPEGs (a few dozen in ImageNet) store inverted ink values.
void cmykToRgb(uint8_t* row, size_t pixels, bool inverted, bool gray) {
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* p = row + 4 * i;
    int c = p[0], m = p[1], y = p[2], k = p[3];
    if (!inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
    const int r = (c * k + 127) / 255, g = (m * k + 127) / 255, b = (y * k + 127) / 255;
    if (gray) {
      row[i] = static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
    } else {
      row[3 * i] = static_cast<uint8_t>(r);
      row[3 * i + 1] = static_cast<uint8_t>(g);
      row[3 * i + 2] = static_cast<uint8_t>(b);
    }
  }
}

}  // namespace

bool isJpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

void JpegDecoder::onError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void JpegDecoder::onMessage(j_common_ptr cinfo, int level) {
  // Level -1 is a warning: corrupt or missing data that libjpeg would paper
  // over with grey. Trace messages (level >= 0) are ignored.
  if (level < 0) onError(cinfo);
}

JpegDecoder::JpegDecoder(const uint8_t* data, size_t size) : data_(data), size_(size) {
  std::memset(&cinfo_, 0, sizeof(cinfo_));
  cinfo_.err = jpeg_std_error(&err_.pub);
  err_.pub.error_exit = &JpegDecoder::onError;
  err_.pub.emit_message = &JpegDecoder::onMessage;
  if (setjmp(err_.jump)) {
    if (created_) jpeg_destroy_decompress(&cinfo_);
    throwJpeg(err_.message);
  }
  jpeg_create_decompress(&cinfo_);
  created_ = true;
  jpeg_mem_src(&cinfo_, data_, static_cast<unsigned long>(size_));
  jpeg_read_header(&cinfo_, TRUE);
}

JpegDecoder::~JpegDecoder() {
  if (created_) jpeg_destroy_decompress(&cinfo_);
}

ImageInfo JpegDecoder::info() const {
  ImageInfo i;
  i.height = cinfo_.image_height;
  i.width = cinfo_.image_width;
  i.channels = cinfo_.num_components;
  i.format = "jpeg";
  return i;
}

DecodedRegion JpegDecoder::decode(int denom, bool gray, int64_t top, int64_t bottom, int64_t left,
                                  int64_t right, std::vector<uint8_t>* buffer) {
  COHORT_ASSERT(denom == 1 || denom == 2 || denom == 4 || denom == 8, "denom ", denom);
  COHORT_ASSERT(0 <= top && top < bottom && 0 <= left && left < right, "region [", top, ", ",
                bottom, ") x [", left, ", ", right, ")");
  if (!hasEndOfImage(data_, size_)) {
    throw DataError("corrupt JPEG: truncated (no end-of-image marker after the image data)");
  }
  if (setjmp(err_.jump)) throwJpeg(err_.message);
  return decodeRegion(denom, gray || cinfo_.num_components == 1, top, bottom, left, right, buffer);
}

DecodedRegion JpegDecoder::decodeRegion(int denom, bool gray, int64_t top, int64_t bottom,
                                        int64_t left, int64_t right,
                                        std::vector<uint8_t>* buffer) {
  const bool cmyk = cinfo_.jpeg_color_space == JCS_CMYK || cinfo_.jpeg_color_space == JCS_YCCK;
  const bool inverted = cinfo_.saw_Adobe_marker;
  cinfo_.scale_num = 1;
  cinfo_.scale_denom = static_cast<unsigned>(denom);
  cinfo_.out_color_space = cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_EXT_RGB;
  jpeg_start_decompress(&cinfo_);
  COHORT_ASSERT(bottom <= cinfo_.output_height && right <= cinfo_.output_width, "region ",
                bottom, "x", right, " outside the ", cinfo_.output_height, "x",
                cinfo_.output_width, " image");
  // jpeg_crop_scanline widens the columns to whole blocks.
  JDIMENSION x = static_cast<JDIMENSION>(left);
  JDIMENSION width = static_cast<JDIMENSION>(right - left);
  if (width < cinfo_.output_width) jpeg_crop_scanline(&cinfo_, &x, &width);
  if (top > 0) jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(top));
  const size_t stride = size_t{width} * static_cast<size_t>(cinfo_.output_components);
  const int64_t rows = bottom - top;
  buffer->resize(stride * static_cast<size_t>(rows));
  uint8_t* base = buffer->data();
  JSAMPROW pointers[16];
  while (cinfo_.output_scanline < bottom) {
    const JDIMENSION first = cinfo_.output_scanline;
    const JDIMENSION n = std::min<JDIMENSION>(16, static_cast<JDIMENSION>(bottom) - first);
    for (JDIMENSION i = 0; i < n; ++i) {
      pointers[i] = base + (static_cast<size_t>(first - top) + i) * stride;
    }
    jpeg_read_scanlines(&cinfo_, pointers, n);
  }
  // Skips the rest of the file: nothing below the region is decoded.
  jpeg_abort_decompress(&cinfo_);
  DecodedRegion r;
  r.pixels = base;
  r.stride = stride;
  r.pixelBytes = gray ? 1 : 3;
  r.top = top;
  r.left = x;
  r.height = rows;
  r.width = width;
  if (cmyk) {
    for (int64_t y = 0; y < rows; ++y) cmykToRgb(base + y * stride, width, inverted, gray);
  }
  return r;
}

}  // namespace cohort::data::detail
