#pragma once

// Text as tokens for language models: `cohort data tokenize` and the token
// shards it writes (docs/token-format.md). A token dataset is a packed
// dataset (dataset.json, the same manifest as image shards) whose encoding is
// "tokens" and whose shards are files of uint16 token ids; `kind: tokens`
// reads it (openTokens in data/dataset.h).

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "cohort/data/dataset_manifest.h"
#include "cohort/storage/storage.h"

namespace cohort::data {

// A token shard file: a 16-byte header, then the tokens as little-endian
// uint16.
inline constexpr char kTokenShardMagic[9] = "COHORTTK";
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 16;

// Checks a token shard's bytes (`size` of them at `data`) against its
// dataset.json entry: the header, the size for `info.records` tokens, and,
// with `vocabSize` > 0, every token below it. Throws DataError naming `where`.
void checkTokenShard(const unsigned char* data, size_t size, const ShardInfo& info,
                     int64_t vocabSize, const std::string& where);

// The one tokenizer so far: each byte of the text is a token (ids 0-255), so
// any text, UTF-8 or not, tokenizes, and every token sequence decodes.
inline constexpr const char* kByteTokenizer = "bytes";
inline constexpr int64_t kByteVocabSize = 256;

std::vector<int64_t> encodeText(const std::string& tokenizer, const std::string& text);
std::string decodeTokens(const std::string& tokenizer, const std::vector<int64_t>& tokens);

struct TokenizeOptions {
  // The last fraction of the token stream is the validation set; 0: none.
  double valFraction = 0.1;
  int64_t shardTokens = 100'000'000;  // tokens per shard file (200 MB)
  bool progress = true;               // a progress line on stderr
  storage::StorageOptions storage;    // DST is a blob URL
};

struct TokenizeResult {
  DatasetManifest train;
  DatasetManifest val;  // no shards with valFraction 0
  int64_t files = 0;    // text files read
};

// Tokenizes SRC (a text file, a directory whose regular files are read in
// sorted path order, or "-" for `in`) with the byte tokenizer into two token
// datasets, DST/train and DST/val (DST: a directory or blob URL). The text is
// one stream in that order; its last `valFraction` of tokens is held out.
// Throws DataError naming SRC when there is no text.
TokenizeResult tokenize(const std::string& src, const std::string& dst,
                        const TokenizeOptions& options, std::istream& in);

}  // namespace cohort::data
