// IDX files (the MNIST family): a big-endian header, then unsigned bytes.
// Read whole into memory: Fashion-MNIST's training images are 47 MB.

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/data/dataset.h"

namespace cohort::data {
namespace {

// Reads a raw or gzip-compressed file whole (zlib reads both).
std::vector<uint8_t> readAll(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw DataError(fmt::format("{}: cannot open", path));
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string msg = gzerror(f, &code);
      gzclose(f);
      throw DataError(fmt::format("{}: corrupt or truncated data: {}", path, msg));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  int code = 0;
  const char* msg = gzerror(f, &code);
  if (code != Z_OK && code != Z_STREAM_END) {
    std::string text = msg;
    gzclose(f);
    throw DataError(fmt::format("{}: corrupt or truncated gzip stream: {}", path, text));
  }
  gzclose(f);
  return out;
}

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

struct IdxArray {
  std::vector<uint8_t> bytes;
  std::vector<uint32_t> dims;
  size_t dataOffset = 0;
};

IdxArray readIdx(const std::string& path, int expectedDims, const char* what) {
  IdxArray a;
  a.bytes = readAll(path);
  if (a.bytes.size() < 4) {
    throw DataError(fmt::format("{}: truncated: {} bytes, not even an IDX header", path,
                                a.bytes.size()));
  }
  const uint8_t* h = a.bytes.data();
  if (h[0] != 0 || h[1] != 0) {
    throw DataError(fmt::format("{}: not an IDX file (magic bytes {:02x} {:02x}, expected 00 00)",
                                path, h[0], h[1]));
  }
  if (h[2] != 0x08) {
    throw DataError(fmt::format("{}: IDX element type 0x{:02x} is not supported (expected 0x08, "
                                "unsigned byte)",
                                path, h[2]));
  }
  if (h[3] != expectedDims) {
    throw DataError(fmt::format("{}: {} file with {} dimensions, expected {}", path, what, h[3],
                                expectedDims));
  }
  a.dataOffset = 4 + 4 * size_t(expectedDims);
  if (a.bytes.size() < a.dataOffset) {
    throw DataError(fmt::format("{}: truncated: expected a {}-byte header, got {} bytes", path,
                                a.dataOffset, a.bytes.size()));
  }
  size_t elements = 1;
  for (int i = 0; i < expectedDims; ++i) {
    a.dims.push_back(bigEndian32(h + 4 + 4 * i));
    if (__builtin_mul_overflow(elements, size_t{a.dims.back()}, &elements)) {
      throw DataError(fmt::format("{}: corrupt header: dimensions {} overflow", path,
                                  fmt::join(a.dims, "x")));
    }
  }
  size_t expected = 0;
  if (__builtin_add_overflow(a.dataOffset, elements, &expected)) {
    throw DataError(fmt::format("{}: corrupt header: dimensions overflow", path));
  }
  if (a.bytes.size() != expected) {
    std::string shape = fmt::format("{}", fmt::join(a.dims, "x"));
    throw DataError(fmt::format("{}: {}: expected {} bytes ({}-byte header + {} {}), got {}", path,
                                a.bytes.size() < expected ? "truncated" : "trailing data", expected,
                                a.dataOffset, shape, what, a.bytes.size()));
  }
  return a;
}

class IdxDataset final : public Dataset {
 public:
  IdxDataset(const std::string& imagesPath, const std::string& labelsPath, int64_t limit,
             int64_t numClasses)
      : imagesPath_(imagesPath) {
    images_ = readIdx(imagesPath, 3, "images");
    const int64_t n = images_.dims[0];
    size_ = limit > 0 ? std::min<int64_t>(limit, n) : n;
    if (size_ == 0) throw DataError(fmt::format("{}: holds no samples", imagesPath));
    shape_ = SampleShape{1, images_.dims[1], images_.dims[2]};
    if (labelsPath.empty()) return;  // images only: every label reads as 0
    labels_ = readIdx(labelsPath, 1, "labels");
    if (labels_.dims[0] != images_.dims[0]) {
      throw DataError(fmt::format("{} holds {} images but {} holds {} labels", imagesPath,
                                  images_.dims[0], labelsPath, labels_.dims[0]));
    }
    const uint8_t* l = labels_.bytes.data() + labels_.dataOffset;
    for (int64_t i = 0; i < size_; ++i) {
      if (l[i] >= numClasses) {
        throw DataError(fmt::format("{}: label {} of sample {} is not below model.num_classes = {}",
                                    labelsPath, int(l[i]), i, numClasses));
      }
    }
  }

  int64_t size() const override { return size_; }
  SampleShape shape() const override { return shape_; }

  int64_t read(int64_t index, float* out, uint64_t /*seed*/) const override {
    const int64_t n = shape_.numel();
    const uint8_t* p = images_.bytes.data() + images_.dataOffset + index * n;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i] * (1.0f / 255.0f);
    return labels_.bytes.empty() ? 0 : labels_.bytes[labels_.dataOffset + index];
  }

  std::string describe() const override {
    return fmt::format("idx {} ({} x {}x{}x{})", imagesPath_, size_, shape_.channels,
                       shape_.height, shape_.width);
  }

 private:
  std::string imagesPath_;
  IdxArray images_;
  IdxArray labels_;
  int64_t size_ = 0;
  SampleShape shape_;
};

}  // namespace

std::shared_ptr<Dataset> openIdx(const std::string& images, const std::string& labels,
                                 int64_t limit, int64_t numClasses) {
  return std::make_shared<IdxDataset>(images, labels, limit, numClasses);
}

}  // namespace cohort::data
