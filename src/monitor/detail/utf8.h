#pragma once

// Text for formats that require valid UTF-8: a TensorBoard event's tag (a
// protobuf string, which TensorBoard's parser refuses otherwise, losing the
// whole file). Invalid bytes become U+FFFD, as nlohmann::json's
// error_handler_t::replace does for the timeline.

#include <cstdint>
#include <string>

namespace cohort::monitor::detail {

inline std::string validUtf8(const std::string& s) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = 0;  // continuation bytes
    uint32_t cp = 0;
    if (c < 0x80) {
      out += s[i++];
      continue;
    } else if ((c >> 5) == 0x6) {
      n = 1, cp = c & 0x1F;
    } else if ((c >> 4) == 0xE) {
      n = 2, cp = c & 0x0F;
    } else if ((c >> 3) == 0x1E) {
      n = 3, cp = c & 0x07;
    } else {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k <= n && i + k < s.size(); ++k) {
      const auto d = static_cast<uint8_t>(s[i + k]);
      if ((d >> 6) != 0x2) break;
      cp = (cp << 6) | (d & 0x3F);
    }
    constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
    if (k <= n || cp < kLeast[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      out += kReplacement;  // for the lead byte; what follows is read afresh
      ++i;
      continue;
    }
    out.append(s, i, n + 1);
    i += n + 1;
  }
  return out;
}

}  // namespace cohort::monitor::detail
