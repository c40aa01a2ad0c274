#pragma once

// JPEG decoding through libjpeg-turbo's libjpeg API, which (unlike
// TurboJPEG 2.1) decodes a region: jpeg_crop_scanline skips the IDCT of block
// columns outside it, jpeg_skip_scanlines the IDCT and colour conversion of
// rows above it, and stopping after its last row skips the rest of the file.
// Combined with DCT scaling (1/2, 1/4, 1/8) this is what makes decodeImage fast.

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>  // jpeglib.h needs size_t and FILE first
#include <vector>

#include <jpeglib.h>

#include "cohort/data/image.h"

namespace cohort::data::detail {

bool isJpeg(const uint8_t* data, size_t size);

// Pixels of a decoded region: rows of `stride` bytes, `pixelBytes` per pixel
// (1 gray, 3 RGB), starting at pixel (top, left) of the scaled image.
struct DecodedRegion {
  const uint8_t* pixels = nullptr;
  size_t stride = 0;
  int pixelBytes = 0;
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// One JPEG, header read on construction. Every libjpeg error or warning
// becomes a DataError with libjpeg's message (a warning means corrupt or
// truncated data here). Not thread-safe; cheap to make.
class JpegDecoder {
 public:
  JpegDecoder(const uint8_t* data, size_t size);
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  ImageInfo info() const;
  // Size of the image decoded at 1/denom (denom 1, 2, 4 or 8).
  static int64_t scaledSize(int64_t size, int denom) { return (size + denom - 1) / denom; }

  // Decodes rows [top, bottom) and at least columns [left, right) of the
  // image at 1/denom (scaled coordinates), as gray (1 byte per pixel) when
  // `gray`, else RGB, into `buffer`; once per decoder.
  DecodedRegion decode(int denom, bool gray, int64_t top, int64_t bottom, int64_t left,
                       int64_t right, std::vector<uint8_t>* buffer);

 private:
  struct ErrorManager {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
  };
  // decode() after its setjmp: libjpeg errors longjmp out of here.
  DecodedRegion decodeRegion(int denom, bool gray, int64_t top, int64_t bottom, int64_t left,
                             int64_t right, std::vector<uint8_t>* buffer);
  static void onError(j_common_ptr cinfo);
  static void onMessage(j_common_ptr cinfo, int level);

  const uint8_t* data_;
  size_t size_;
  jpeg_decompress_struct cinfo_;
  ErrorManager err_;
  bool created_ = false;
};

}  // namespace cohort::data::detail
