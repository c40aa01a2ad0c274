#pragma once

// BERT's WordPiece model (tokenizer.json "WordPiece", or a vocab.txt): a
// word as the longest pieces of the vocabulary from its start, each after
// the first with the continuing prefix ("##"); a word with no such split,
// or longer than maxChars characters, is the unk token.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cohort::data::detail {

class WordPieceModel {
 public:
  // Throws DataError naming `origin` when `unkToken` is not in `vocab`.
  WordPieceModel(std::unordered_map<std::string, int64_t> vocab, std::string unkToken, std::string prefix,
                 size_t maxChars, const std::string& origin);
  // Appends the tokens of `word`. Thread-safe.
  void encode(std::string_view word, std::vector<int64_t>& out) const;
  const std::unordered_map<std::string, int64_t>& vocab() const { return vocab_; }

 private:
  std::unordered_map<std::string, int64_t> vocab_;
  std::string prefix_;
  size_t maxChars_;
  int64_t unk_ = -1;
};

}  // namespace cohort::data::detail
