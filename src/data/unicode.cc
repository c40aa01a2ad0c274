#include "data/detail/unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <functional>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::data::detail {

uint32_t decodeUtf8(std::string_view s, size_t at, size_t* length) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + at;
  const size_t n = utf8Length(p, s.size() - at);
  *length = n == 0 ? 1 : n;
  switch (n) {
    case 1: return p[0];
    case 2: return (uint32_t{p[0]} & 0x1F) << 6 | (p[1] & 0x3F);
    case 3: return (uint32_t{p[0]} & 0x0F) << 12 | (uint32_t{p[1]} & 0x3F) << 6 | (p[2] & 0x3F);
    case 4:
      return (uint32_t{p[0]} & 0x07) << 18 | (uint32_t{p[1]} & 0x3F) << 12 | (uint32_t{p[2]} & 0x3F) << 6 |
             (p[3] & 0x3F);
    default: return kNotUtf8;
  }
}


bool isUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t at = 0; at < s.size();) {
    const size_t n = utf8Length(p + at, s.size() - at);
    if (n == 0) return false;
    at += n;
  }
  return true;
}

namespace {

constexpr uint32_t mask(UCharCategory c) { return U_MASK(c); }

bool inCategories(uint32_t cp, uint32_t categories) {
  if (cp > 0x10FFFF) return false;
  return (U_MASK(u_charType(static_cast<UChar32>(cp))) & categories) != 0;
}

}  // namespace

bool isLetter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return inCategories(cp, U_GC_L_MASK);
}

bool isNumber(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return inCategories(cp, U_GC_N_MASK);
}

bool isWhitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return cp <= 0x10FFFF && u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

bool isPunctuation(uint32_t cp) { return inCategories(cp, U_GC_P_MASK); }

bool isNonspacingMark(uint32_t cp) { return inCategories(cp, mask(U_NON_SPACING_MARK)); }

bool isOther(uint32_t cp) { return inCategories(cp, U_GC_C_MASK); }

bool isCjkIdeograph(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) ||
         (cp >= 0x2B820 && cp <= 0x2CEAF) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

namespace {

// Applies `f` (UTF-16 in, UTF-16 out) to each run of UTF-8 in `s`, keeping
// the bytes between runs.
std::string throughUtf16(std::string_view s,
                         const std::function<std::u16string(const std::u16string&)>& f) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t at = 0;
  while (at < s.size()) {
    size_t end = at;
    while (end < s.size()) {
      const size_t n = utf8Length(p + end, s.size() - end);
      if (n == 0) break;
      end += n;
    }
    if (end > at) {
      std::u16string wide;
      for (size_t i = at; i < end;) {
        size_t n = 0;
        const uint32_t cp = decodeUtf8(s, i, &n);
        i += n;
        if (cp >= 0x10000) {
          wide += static_cast<char16_t>(0xD800 + ((cp - 0x10000) >> 10));
          wide += static_cast<char16_t>(0xDC00 + ((cp - 0x10000) & 0x3FF));
        } else {
          wide += static_cast<char16_t>(cp);
        }
      }
      const std::u16string done = f(wide);
      for (size_t i = 0; i < done.size(); ++i) {
        uint32_t cp = done[i];
        if (cp >= 0xD800 && cp <= 0xDBFF && i + 1 < done.size()) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (done[++i] - 0xDC00);
        }
        appendUtf8(out, cp);
      }
      at = end;
    }
    if (at < s.size()) out += s[at++];  // a byte that is not UTF-8
  }
  return out;
}

// Calls an ICU function of the shape (dst, capacity, &status) until the
// buffer is large enough.
template <typename F>
std::u16string icuString(size_t guess, const char* what, F&& call) {
  std::u16string out(guess + 16, u'\0');
  UErrorCode status = U_ZERO_ERROR;
  int32_t n = call(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    out.assign(static_cast<size_t>(n) + 1, u'\0');
    status = U_ZERO_ERROR;
    n = call(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &status);
  }
  if (U_FAILURE(status)) throw DataError(std::string(what) + " failed: " + u_errorName(status));
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

std::string normalize(std::string_view s, NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* n = nullptr;
  switch (form) {
    case NormalForm::nfc: n = unorm2_getNFCInstance(&status); break;
    case NormalForm::nfd: n = unorm2_getNFDInstance(&status); break;
    case NormalForm::nfkc: n = unorm2_getNFKCInstance(&status); break;
    case NormalForm::nfkd: n = unorm2_getNFKDInstance(&status); break;
  }
  if (U_FAILURE(status)) throw DataError(std::string("Unicode normalization is not available: ") + u_errorName(status));
  return throughUtf16(s, [&](const std::u16string& w) {
    return icuString(w.size() * 2, "Unicode normalization", [&](UChar* dst, int32_t cap, UErrorCode* st) {
      return unorm2_normalize(n, reinterpret_cast<const UChar*>(w.data()), static_cast<int32_t>(w.size()), dst, cap,
                              st);
    });
  });
}

std::string lowercase(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& c : out) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    }
    return out;
  }
  return throughUtf16(s, [&](const std::u16string& w) {
    return icuString(w.size() + w.size() / 2, "lower-casing", [&](UChar* dst, int32_t cap, UErrorCode* st) {
      return u_strToLower(dst, cap, reinterpret_cast<const UChar*>(w.data()), static_cast<int32_t>(w.size()), "",
                          st);
    });
  });
}

}  // namespace cohort::data::detail
