// TensorBoard event files (src/monitor/tensorboard.cc) for any scalar tag.
//
// Input: NUL-separated tags. Each becomes a scalar; the file read back must
// be whole TFRecords with valid CRCs, one Event per scalar carrying its tag
// as valid UTF-8 (TensorBoard's protobuf parser drops a file otherwise),
// byte for byte when the tag was valid UTF-8.

#include <fmt/format.h>

#include "cohort/monitor/tensorboard.h"
#include "fuzz_util.h"

namespace {

using cohort::fuzz::require;

uint32_t crc32c(const char* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= static_cast<uint8_t>(p[i]);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t little(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

bool validUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c >> 5) == 6) {
      n = 1, cp = c & 0x1F;
    } else if ((c >> 4) == 14) {
      n = 2, cp = c & 0x0F;
    } else if ((c >> 3) == 30) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (n >= s.size() - i) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<uint8_t>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// Protobuf: the length-delimited field `field` of `msg` (the first).
std::string lengthDelimited(const std::string& msg, uint32_t field) {
  size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0; at < msg.size() && shift < 64; shift += 7) {
      const auto b = static_cast<uint8_t>(msg[at++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    cohort::fuzz::finding("a truncated varint in an Event");
  };
  while (at < msg.size()) {
    const uint64_t key = varint();
    switch (key & 7) {
      case 0: varint(); break;
      case 1: at += 8; break;
      case 5: at += 4; break;
      case 2: {
        const uint64_t n = varint();
        require(n <= msg.size() - at, "a length-delimited field past the Event's end");
        if ((key >> 3) == field) return msg.substr(at, n);
        at += n;
        break;
      }
      default: cohort::fuzz::finding(fmt::format("wire type {} in an Event", key & 7));
    }
  }
  cohort::fuzz::finding(fmt::format("no field {} in an Event", field));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  const std::vector<std::string> tags = fuzz::split(fuzz::asString(data, size), '\0');
  const auto dir = fuzz::scratchDir() / "tensorboard";
  std::string path;
  {
    monitor::TensorBoardWriter w(dir.string());
    path = w.path();
    for (size_t i = 0; i < tags.size(); ++i) w.addScalar(tags[i], int64_t(i) - 1, 0.5 * double(i));
  }
  const std::string file = fuzz::readFile(path);
  std::filesystem::remove(path);
  size_t at = 0;
  for (size_t r = 0; r <= tags.size(); ++r) {
    require(file.size() - at >= 12, fmt::format("record {} cut short", r));
    const uint64_t length = little(file, at, 8);
    require(little(file, at + 8, 4) == masked(crc32c(file.data() + at, 8)), "bad length CRC");
    require(length <= file.size() - at - 16, fmt::format("record {} runs past the file", r));
    const std::string event = file.substr(at + 12, length);
    require(little(file, at + 12 + length, 4) == masked(crc32c(event.data(), event.size())),
            "bad data CRC");
    at += 16 + length;
    if (r == 0) continue;  // file_version
    const std::string tag = lengthDelimited(lengthDelimited(lengthDelimited(event, 5), 1), 1);
    require(validUtf8(tag), "a tag that is not valid UTF-8 reached the file");
    const std::string& given = tags[r - 1];
    require(!validUtf8(given) || tag == given, "a valid UTF-8 tag was changed");
  }
  require(at == file.size(), "bytes after the last record");
  return 0;
}
