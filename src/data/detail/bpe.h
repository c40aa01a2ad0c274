#pragma once

// The byte-pair-encoding model of Hugging Face's tokenizer.json ("BPE") and
// of GPT-2's vocab.json + merges.txt: a word's characters, merged pair by
// pair, lowest rank first (the leftmost of equal ranks), into tokens of the
// vocabulary.

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cohort::data::detail {

struct BpeOptions {
  std::string unkToken;      // "" for none: a character out of the vocabulary is dropped
  bool byteFallback = false; // such a character as its bytes' tokens <0xNN>, when all are there
  bool fuseUnk = false;      // consecutive unknown characters as one unk token
  bool ignoreMerges = false; // a word in the vocabulary is its token, unmerged
};

class BpeModel {
 public:
  // `merges` in rank order; `mergeOrigin(i)` names merge i in an error
  // ("merges.txt line 12"). Throws DataError naming it when a merge's
  // tokens or their concatenation are not in `vocab`, and naming
  // `origin` when the unk token is not.
  BpeModel(std::unordered_map<std::string, int64_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& origin, const std::function<std::string(size_t)>& mergeOrigin);

  // Appends the tokens of `word` (UTF-8; a byte that is not UTF-8 is a
  // character of its own). Thread-safe.
  void encode(std::string_view word, std::vector<int64_t>& out) const;

  const std::unordered_map<std::string, int64_t>& vocab() const { return vocab_; }

 private:
  void merge(std::string_view word, std::vector<int64_t>& out) const;

  std::unordered_map<std::string, int64_t> vocab_;
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int64_t>> merges_;
  BpeOptions options_;
  int64_t unk_ = -1;
  int64_t byteIds_[256];

  // Words seen, and their tokens: text repeats its words.
  static constexpr size_t kCacheWords = 1 << 18;
  static constexpr size_t kCacheLongest = 256;  // bytes
  mutable std::mutex cacheMutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace cohort::data::detail
