#include "cohort/monitor/tensorboard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "cohort/core/error.h"
#include "cohort/core/fence.h"
#include "cohort/core/log.h"
#include "cohort/core/time.h"
#include "cohort/core/net.h"
#include "monitor/detail/crc32c.h"
#include "monitor/detail/utf8.h"

namespace cohort::monitor {
namespace {

// The few pieces of the protobuf wire format an Event needs. Field numbers,
// from tensorflow/core/util/event.proto and framework/summary.proto:
//   Event         1 wall_time (double)  2 step (int64)  3 file_version (string)
//                 5 summary (Summary)
//   Summary       1 value (repeated Summary.Value)
//   Summary.Value 1 tag (string)  2 simple_value (float)
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void putVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void putKey(std::string& out, uint32_t field, WireType type) {
  putVarint(out, (static_cast<uint64_t>(field) << 3) | type);
}

template <typename T>
void putLittleEndian(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void putDouble(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  putKey(out, field, kFixed64);
  putLittleEndian(out, bits);
}

void putFloat(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  putKey(out, field, kFixed32);
  putLittleEndian(out, bits);
}

// int64 is a varint of the two's complement: a negative step takes 10 bytes.
void putInt64(std::string& out, uint32_t field, int64_t v) {
  putKey(out, field, kVarint);
  putVarint(out, static_cast<uint64_t>(v));
}

void putBytes(std::string& out, uint32_t field, const std::string& bytes) {
  putKey(out, field, kLengthDelimited);
  putVarint(out, bytes.size());
  out += bytes;
}

std::atomic<int> writersOpened{0};

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw IoError(fmt::format("cannot create the TensorBoard directory {}: {}", dir,
                              ec ? ec.message() : "not a directory"));
  }
  const std::string prefix = fmt::format("{}/events.out.tfevents.{}.{}.{}.", dir,
                                         static_cast<int64_t>(std::time(nullptr)), hostName(),
                                         static_cast<int>(getpid()));
  // O_EXCL: another writer (a restarted rank whose pid was reused) keeps its
  // file; this one takes the next number.
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 1000; ++attempt) {
    path_ = prefix + std::to_string(writersOpened.fetch_add(1));
    fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", path_, std::strerror(errno)));
  file_ = fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    throw IoError(fmt::format("cannot open {}: {}", path_, std::strerror(err)));
  }
  std::string event;
  putDouble(event, 1, unixSeconds());
  putBytes(event, 3, "brain.Event:2");
  std::lock_guard<std::mutex> g(mutex_);
  try {
    writeRecord(event);
    if (std::fflush(file_) != 0) {
      throw IoError(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
    }
  } catch (...) {
    std::fclose(file_);
    file_ = nullptr;
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ == nullptr) return;
  if (std::fclose(file_) != 0) {
    log::warn("TensorBoard events {}: the last records may be lost: {}", path_,
              std::strerror(errno));
  }
}

void TensorBoardWriter::addScalar(const std::string& tag, int64_t step, double value) {
  addScalar(tag, step, value, unixSeconds());
}

void TensorBoardWriter::addScalar(const std::string& tag, int64_t step, double value,
                                  double wallTime) {
  std::string summaryValue;
  putBytes(summaryValue, 1, detail::validUtf8(tag));
  putFloat(summaryValue, 2, static_cast<float>(value));
  std::string summary;
  putBytes(summary, 1, summaryValue);
  std::string event;
  putDouble(event, 1, wallTime);
  putInt64(event, 2, step);
  putBytes(event, 5, summary);
  std::lock_guard<std::mutex> g(mutex_);
  writeRecord(event);
}

void TensorBoardWriter::flush() {
  std::lock_guard<std::mutex> g(mutex_);
  if (std::fflush(file_) != 0) {
    throw IoError(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
  }
}

void TensorBoardWriter::writeRecord(const std::string& event) {
  fence::check("a TensorBoard event");
  std::string header;
  putLittleEndian(header, static_cast<uint64_t>(event.size()));
  putLittleEndian(header, detail::maskedCrc32c(header.data(), 8));
  std::string footer;
  putLittleEndian(footer, detail::maskedCrc32c(event.data(), event.size()));
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size() ||
      std::fwrite(event.data(), 1, event.size(), file_) != event.size() ||
      std::fwrite(footer.data(), 1, footer.size(), file_) != footer.size()) {
    throw IoError(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
  }
}

}  // namespace cohort::monitor
