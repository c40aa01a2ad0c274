#include "data/detail/pre_tokenizer.h"

#include <array>

#include "data/detail/unicode.h"

namespace cohort::data::detail {

namespace {

enum Class : uint8_t { kLetter, kNumber, kSpace, kOther };

Class classOf(uint32_t cp) {
  if (cp < 0x80) {
    // ASCII by table: most text is.
    static const std::array<Class, 128> ascii = [] {
      std::array<Class, 128> t{};
      for (uint32_t c = 0; c < 128; ++c) {
        t[c] = isLetter(c) ? kLetter : isNumber(c) ? kNumber : isWhitespace(c) ? kSpace : kOther;
      }
      return t;
    }();
    return ascii[cp];
  }
  return isLetter(cp) ? kLetter : isNumber(cp) ? kNumber : isWhitespace(cp) ? kSpace : kOther;
}

// The text's characters: where each starts, and its class.
struct Chars {
  std::vector<size_t> at;  // at[i]: byte offset of char i; at[n]: the end
  std::vector<Class> cls;
  std::vector<uint32_t> cp;
  explicit Chars(std::string_view s) {
    at.reserve(s.size() + 1);
    cls.reserve(s.size());
    cp.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t n = 0;
      const uint32_t c = static_cast<unsigned char>(s[i]) < 0x80 ? static_cast<unsigned char>(s[i]) : decodeUtf8(s, i, &n);
      if (static_cast<unsigned char>(s[i]) < 0x80) n = 1;
      at.push_back(i);
      cls.push_back(classOf(c));
      cp.push_back(c);
      i += n;
    }
    at.push_back(s.size());
  }
  size_t size() const { return cls.size(); }
};

// The number of characters of a contraction at i ('s 't 're 've 'm 'll 'd,
// in that order of preference), or 0.
size_t contraction(const Chars& c, size_t i) {
  if (c.cp[i] != '\'' || i + 1 >= c.size()) return 0;
  const uint32_t a = c.cp[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  const uint32_t b = i + 2 < c.size() ? c.cp[i + 2] : 0;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

void splitGpt2(std::string_view text, std::vector<std::string>& out) {
  const Chars c(text);
  const size_t n = c.size();
  auto run = [&](size_t from, Class k) {
    while (from < n && c.cls[from] == k) ++from;
    return from;
  };
  for (size_t i = 0; i < n;) {
    size_t end = i + contraction(c, i);
    if (end == i) {
      // " ?X+" for X a letter, a number or other: an optional space, then a run.
      const size_t first = c.cp[i] == ' ' && i + 1 < n && c.cls[i + 1] != kSpace ? i + 1 : i;
      if (c.cls[first] != kSpace) {
        end = run(first, c.cls[first]);
      } else {
        // "\s+(?!\S)|\s+": a run of spaces, less its last when a non-space
        // follows and the run is longer than one.
        end = run(i, kSpace);
        if (end < n && end - i > 1) --end;
      }
    }
    out.emplace_back(text.substr(c.at[i], c.at[end] - c.at[i]));
    i = end;
  }
}

namespace {

struct ByteLevelTables {
  std::array<std::string, 256> toChar;
  // Code point (< 0x144) -> byte + 1, 0 for none.
  std::array<int16_t, 0x144> toByte{};
  ByteLevelTables() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
      appendUtf8(toChar[b], cp);
      toByte[cp] = static_cast<int16_t>(b + 1);
    }
  }
};

const ByteLevelTables& byteLevel() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

std::string bytesToByteLevel(std::string_view s) {
  const auto& t = byteLevel();
  std::string out;
  out.reserve(s.size() * 2);
  for (char b : s) out += t.toChar[static_cast<unsigned char>(b)];
  return out;
}

std::string byteLevelToBytes(std::string_view s) {
  const auto& t = byteLevel();
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = 0;
    const uint32_t cp = decodeUtf8(s, i, &n);
    if (cp < t.toByte.size() && t.toByte[cp] > 0) {
      out += static_cast<char>(t.toByte[cp] - 1);
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

void splitBert(std::string_view text, std::vector<std::string>& out) {
  size_t start = 0;
  bool inWord = false;
  for (size_t i = 0; i < text.size();) {
    size_t n = 0;
    const uint32_t cp = decodeUtf8(text, i, &n);
    const bool punct = (cp < 0x80 && ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
                                      (cp >= 123 && cp <= 126))) ||
                       isPunctuation(cp);
    if (punct || isWhitespace(cp)) {
      if (inWord) out.emplace_back(text.substr(start, i - start));
      inWord = false;
      if (punct) out.emplace_back(text.substr(i, n));
    } else if (!inWord) {
      inWord = true;
      start = i;
    }
    i += n;
  }
  if (inWord) out.emplace_back(text.substr(start));
}

void splitWhitespace(std::string_view text, std::vector<std::string>& out) {
  size_t start = 0;
  bool inWord = false;
  for (size_t i = 0; i < text.size();) {
    size_t n = 0;
    const uint32_t cp = decodeUtf8(text, i, &n);
    if (isWhitespace(cp)) {
      if (inWord) out.emplace_back(text.substr(start, i - start));
      inWord = false;
    } else if (!inWord) {
      inWord = true;
      start = i;
    }
    i += n;
  }
  if (inWord) out.emplace_back(text.substr(start));
}

void splitBefore(std::string_view text, std::string_view mark, std::vector<std::string>& out) {
  size_t start = 0;
  for (size_t at = text.find(mark, 1); at != std::string_view::npos && !mark.empty(); at = text.find(mark, at + 1)) {
    if (at > start) out.emplace_back(text.substr(start, at - start));
    start = at;
  }
  if (start < text.size()) out.emplace_back(text.substr(start));
}

}  // namespace cohort::data::detail
