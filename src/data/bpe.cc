#include "data/detail/bpe.h"

#include <fmt/format.h>

#include <queue>

#include "cohort/core/error.h"
#include "data/detail/unicode.h"

namespace cohort::data::detail {

namespace {

uint64_t pairKey(int64_t a, int64_t b) { return static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b); }

}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int64_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
                   const std::string& origin, const std::function<std::string(size_t)>& mergeOrigin)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  for (const auto& [token, id] : vocab_) {
    if (id < 0 || id > INT32_MAX) throw DataError(fmt::format("{}: token '{}': id {} out of range", origin, token, id));
  }
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& a = merges[i].first;
    const std::string& b = merges[i].second;
    auto find = [&](const std::string& t, const char* what) {
      auto it = vocab_.find(t);
      if (it == vocab_.end()) {
        throw DataError(fmt::format("{}: '{} {}': {} '{}' is not in the vocabulary", mergeOrigin(i), a, b, what, t));
      }
      return it->second;
    };
    const int64_t left = find(a, "the first token"), right = find(b, "the second token");
    const int64_t merged = find(a + b, "the merged token");
    // The first of two equal merges ranks (as Hugging Face's reader keeps it).
    merges_.emplace(pairKey(left, right), std::make_pair(static_cast<int32_t>(i), merged));
  }
  if (!options_.unkToken.empty()) {
    auto it = vocab_.find(options_.unkToken);
    if (it == vocab_.end()) {
      throw DataError(fmt::format("{}: model.unk_token '{}' is not in the vocabulary", origin, options_.unkToken));
    }
    unk_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byteIds_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

void BpeModel::encode(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (options_.ignoreMerges) {
    if (auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cacheMutex_);
    if (auto it = cache_.find(std::string(word)); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int64_t> tokens;
  merge(word, tokens);
  out.insert(out.end(), tokens.begin(), tokens.end());
  // Only words: a tokenizer without a pre-tokenizer (Llama-2-style) gives
  // whole texts, which would fill the cache and never repeat.
  if (word.size() > kCacheLongest) return;
  std::lock_guard<std::mutex> lock(cacheMutex_);
  if (cache_.size() >= kCacheWords) cache_.clear();
  cache_.emplace(word, std::move(tokens));
}

void BpeModel::merge(std::string_view word, std::vector<int64_t>& out) const {
  // The word's symbols as a list over a vector (`id` -1: merged away).
  struct Symbol {
    int64_t id;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  std::string one;
  bool lastUnk = false;
  auto add = [&](int64_t id) {
    const int at = static_cast<int>(symbols.size());
    symbols.push_back({id, at - 1, at + 1});
  };
  for (size_t at = 0; at < word.size();) {
    size_t n = 0;
    decodeUtf8(word, at, &n);
    one.assign(word.substr(at, n));
    if (auto it = vocab_.find(one); it != vocab_.end()) {
      add(it->second);
      lastUnk = false;
    } else {
      bool bytes = options_.byteFallback;
      for (size_t i = 0; i < n && bytes; ++i) bytes = byteIds_[static_cast<unsigned char>(word[at + i])] >= 0;
      if (bytes) {
        for (size_t i = 0; i < n; ++i) add(byteIds_[static_cast<unsigned char>(word[at + i])]);
        lastUnk = false;
      } else if (unk_ >= 0) {
        if (!(options_.fuseUnk && lastUnk)) add(unk_);
        lastUnk = true;
      }
    }
    at += n;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Candidate merges, lowest rank first, then leftmost. A candidate whose
  // symbols changed since it was queued is stale and skipped.
  struct Candidate {
    int32_t rank;
    int pos;
    int64_t left, right, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int pos) {
    if (pos < 0) return;
    const int next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(pairKey(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.first, pos, symbols[pos].id, symbols[next].id, it->second.second});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& s = symbols[c.pos];
    if (s.id != c.left || s.next < 0 || symbols[s.next].id != c.right) continue;
    Symbol& right = symbols[s.next];
    s.id = c.merged;
    right.id = -1;
    s.next = right.next;
    if (s.next >= 0) symbols[s.next].prev = c.pos;
    consider(s.prev);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace cohort::data::detail
