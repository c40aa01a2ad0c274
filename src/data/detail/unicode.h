#pragma once

// Unicode for the tokenizers (data/tokenizer.h): UTF-8 decoding that never
// fails (a byte that is not part of a UTF-8 character is a unit of its
// own), the character classes the Hugging Face and GPT-2 pre-tokenizers
// test, and normalization forms, from ICU.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cohort/core/utf8.h"

namespace cohort::data::detail {

// The code point given to a byte that is not part of a UTF-8 character:
// beyond Unicode, so that no class test holds for it.
inline constexpr uint32_t kNotUtf8 = 0xFFFFFFFF;

// The unit of `s` at `at`: its code point and byte length (kNotUtf8 and 1
// for a byte that is not UTF-8).
uint32_t decodeUtf8(std::string_view s, size_t at, size_t* length);

// Whether `s` is all UTF-8.
bool isUtf8(std::string_view s);

// Character classes, as \p{L}, \p{N}, Unicode's White_Space, \p{P}, \p{Mn}.
bool isLetter(uint32_t cp);
bool isNumber(uint32_t cp);
bool isWhitespace(uint32_t cp);
bool isPunctuation(uint32_t cp);
bool isNonspacingMark(uint32_t cp);
// A control or other "C" character (Cc, Cf, Cs, Co, Cn), as BERT removes.
bool isOther(uint32_t cp);
// A CJK ideograph, as BERT's normalizer isolates.
bool isCjkIdeograph(uint32_t cp);

enum class NormalForm { nfc, nfd, nfkc, nfkd };
// `s` in normal form `form`; bytes that are not UTF-8 stay as they are.
std::string normalize(std::string_view s, NormalForm form);
// `s` in lower case (Unicode's full mapping, the root locale).
std::string lowercase(std::string_view s);

}  // namespace cohort::data::detail
