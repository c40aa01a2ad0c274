#pragma once

// Splitting text into words before a tokenizer's model sees them, as
// Hugging Face's pre-tokenizers do (tokenizer.json "pre_tokenizer").

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::data::detail {

// GPT-2's split, the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched by hand (\s: Unicode's White_Space, as Hugging Face's library
// reads it); a byte that is not UTF-8 is a character of none of the
// classes. Appends the pieces of `text` to `out`.
void splitGpt2(std::string_view text, std::vector<std::string>& out);

// The text of a pattern splitGpt2 implements.
inline constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// GPT-2's map of bytes to printable characters (byte-level BPE's
// alphabet): `s`'s bytes as those characters, in UTF-8.
std::string bytesToByteLevel(std::string_view s);
// The inverse: each character of the alphabet as its byte, any other
// character as its own UTF-8.
std::string byteLevelToBytes(std::string_view s);

// BERT's split: on whitespace (dropped), each punctuation character a
// piece of its own.
void splitBert(std::string_view text, std::vector<std::string>& out);

// Split on whitespace (dropped).
void splitWhitespace(std::string_view text, std::vector<std::string>& out);

// Split before each `mark` (a piece starts with it, "MergedWithNext").
void splitBefore(std::string_view text, std::string_view mark, std::vector<std::string>& out);

}  // namespace cohort::data::detail
