#include "data/detail/wordpiece.h"

#include <fmt/format.h>

#include "cohort/core/error.h"
#include "data/detail/unicode.h"

namespace cohort::data::detail {

WordPieceModel::WordPieceModel(std::unordered_map<std::string, int64_t> vocab, std::string unkToken,
                               std::string prefix, size_t maxChars, const std::string& origin)
    : vocab_(std::move(vocab)), prefix_(std::move(prefix)), maxChars_(maxChars) {
  auto it = vocab_.find(unkToken);
  if (it == vocab_.end()) {
    throw DataError(fmt::format("{}: the unk token '{}' is not in the vocabulary", origin, unkToken));
  }
  unk_ = it->second;
}

void WordPieceModel::encode(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  // Character boundaries: pieces end between characters.
  std::vector<size_t> ends;
  for (size_t i = 0; i < word.size();) {
    size_t n = 0;
    decodeUtf8(word, i, &n);
    i += n;
    ends.push_back(i);
  }
  if (ends.size() > maxChars_) {
    out.push_back(unk_);
    return;
  }
  const size_t before = out.size();
  std::string piece;
  size_t start = 0;
  while (start < word.size()) {
    int64_t found = -1;
    size_t foundEnd = 0;
    for (auto e = ends.rbegin(); e != ends.rend() && *e > start; ++e) {
      piece.assign(start > 0 ? prefix_ : std::string());
      piece.append(word.substr(start, *e - start));
      if (auto it = vocab_.find(piece); it != vocab_.end()) {
        found = it->second;
        foundEnd = *e;
        break;
      }
    }
    if (found < 0) {
      out.resize(before);
      out.push_back(unk_);
      return;
    }
    out.push_back(found);
    start = foundEnd;
  }
}

}  // namespace cohort::data::detail
