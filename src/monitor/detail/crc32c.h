#pragma once

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
// TFRecord framing. None of the libraries cohort links computes it (zlib's
// crc32 uses the IEEE polynomial; OpenSSL and xxHash have no CRC-32C), and a
// byte-wise table is fast enough for a few scalars per step.

#include <array>
#include <cstddef>
#include <cstdint>

namespace cohort::monitor::detail {

constexpr std::array<uint32_t, 256> makeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

inline constexpr std::array<uint32_t, 256> kCrc32cTable = makeCrc32cTable();

// CRC-32C of `size` bytes; crc32c("123456789") == 0xE3069283.
inline uint32_t crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

// TFRecord stores a rotated and offset CRC, so that a CRC computed over data
// that itself contains CRCs does not degenerate.
inline uint32_t maskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

}  // namespace cohort::monitor::detail
