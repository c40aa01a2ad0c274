#pragma once

// Text as tokens for language models: `cohort data tokenize` and the token
// shards it writes (docs/token-format.md). A token dataset is a packed
// dataset (dataset.json, the same manifest as image shards) whose encoding is
// "tokens" and whose shards are files of uint16 token ids; `kind: tokens`
// reads it (openTokens in data/dataset.h).

#include <cstdint>
#include <istream>
#include <memory>
#include <string>
#include <vector>

#include "cohort/data/dataset_manifest.h"
#include "cohort/data/tokenizer.h"
#include "cohort/storage/storage.h"

namespace cohort::data {

// A token shard file: a 16-byte header, then the tokens as little-endian
// uint16 (version 1) or uint32 (version 2, dataset.json's token_bytes 4).
inline constexpr char kTokenShardMagic[9] = "COHORTTK";
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr uint32_t kTokenShardVersionWide = 2;
inline constexpr int64_t kTokenShardHeaderBytes = 16;

// Token `k` of a shard's tokens at `p`, `width` (2 or 4) bytes each.
inline int64_t tokenAt(const unsigned char* p, int width, int64_t k) {
  const unsigned char* q = p + static_cast<size_t>(width) * static_cast<size_t>(k);
  return width == 2 ? (int64_t(q[0]) | int64_t(q[1]) << 8)
                    : (int64_t(q[0]) | int64_t(q[1]) << 8 | int64_t(q[2]) << 16 | int64_t(q[3]) << 24);
}

// Checks a token shard's bytes (`size` of them at `data`) against its
// dataset.json entry: the header (its version that of `width`-byte
// tokens), the size for `info.records` tokens, and, with `vocabSize` > 0,
// every token below it. Throws DataError naming `where`.
void checkTokenShard(const unsigned char* data, size_t size, const ShardInfo& info, int64_t vocabSize,
                     const std::string& where, int width = 2);

struct TokenizeOptions {
  // "bytes" (each byte a token) or "sentencepiece": a model trained on the
  // training part of the text (vocabSize, modelType), or `tokenizerModel`;
  // or the path of a tokenizer file (loadTokenizerFile: tokenizer.json,
  // vocab.json with `merges`, vocab.txt (`lowercase`), a .model, a
  // directory of them).
  std::string tokenizer = "bytes";
  std::string merges;      // GPT-2's merges.txt for a vocab.json ("": beside it)
  bool lowercase = true;   // a vocab.txt lower-cases (bert-base-uncased)
  int64_t vocabSize = 8000;
  std::string modelType = "bpe";  // bpe | unigram
  std::string tokenizerModel;     // an existing SentencePiece model file
  // Or a tokenizer of the caller's own, ready to use (its name and model go
  // into dataset.json): what a program embedding cohort brings.
  std::shared_ptr<const Tokenizer> custom;
  // The last fraction of the text is the validation set; 0: none. With
  // sentencepiece the split moves to the next line's start.
  double valFraction = 0.1;
  int64_t shardTokens = 100'000'000;  // tokens per shard file (200 MB)
  bool progress = true;               // a progress line on stderr
  storage::StorageOptions storage;    // DST is a blob URL
};

struct TokenizeResult {
  DatasetManifest train;
  DatasetManifest val;  // no shards with valFraction 0
  int64_t files = 0;    // text files read
  double seconds = 0;   // encoding and writing (not the tokenizer's training)
};

// Tokenizes SRC (a text file, a directory whose regular files are read in
// sorted path order, or "-" for `in`) into two token datasets, DST/train and
// DST/val (DST: a directory or blob URL), each with the tokenizer's model
// when it has one (tokenizer.model). The text is one stream in that order;
// its last `valFraction` is held out. Throws DataError naming SRC when there
// is no text, UsageError for bad options.
TokenizeResult tokenize(const std::string& src, const std::string& dst,
                        const TokenizeOptions& options, std::istream& in);

}  // namespace cohort::data
