#include "cohort/core/base64.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace cohort {
namespace {

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string base64Encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += kBase64[(v >> 6) & 63];
    out += kBase64[v & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kBase64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64Decode(const std::string& text) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  size_t symbols = 0;
  for (char c : text) {
    if (c == '=') {
      ++pad;
      continue;
    }
    const char* p = c == '\0' ? nullptr : std::strchr(kBase64, c);
    if (p == nullptr || pad > 0) throw std::invalid_argument("not base64");
    acc = (acc << 6) | static_cast<uint32_t>(p - kBase64);
    bits += 6;
    ++symbols;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  // Padding may be left out, but a lone trailing symbol is never valid.
  const bool padded = (symbols + pad) % 4 == 0;
  if (pad > 2 || (!padded && (pad > 0 || symbols % 4 == 1))) {
    throw std::invalid_argument("not base64");
  }
  return out;
}

}  // namespace cohort
