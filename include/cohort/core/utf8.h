#pragma once

// UTF-8 byte by byte, for the tokenizers and the XML of blob storage.

#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort {

// The length of the UTF-8 character at `p` (of `n` bytes), or 0 when the
// bytes there are not one (overlong, surrogate, truncated, past U+10FFFF).
size_t utf8Length(const unsigned char* p, size_t n);

// Appends code point `cp` (below 0x200000) to `out` as UTF-8.
void appendUtf8(std::string& out, uint32_t cp);

}  // namespace cohort
