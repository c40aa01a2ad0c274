#pragma once

// Hugging Face's tokenizer.json as a cohort Tokenizer, and the files that
// convert to it (GPT-2's vocab.json + merges.txt, BERT's vocab.txt).

#include <memory>
#include <string>

#include "cohort/data/tokenizer.h"

namespace cohort::data::detail {

// The tokenizer of a tokenizer.json whose text is `json`. Throws DataError
// naming `origin` and the field for what is malformed or not implemented.
std::shared_ptr<const Tokenizer> makeHfTokenizer(std::string json, const std::string& origin);

// The tokenizer.json equivalent of GPT-2's files (vocab.json's text and
// merges.txt's): the ByteLevel pre-tokenizer and decoder, a BPE model,
// <|endoftext|> (when in the vocabulary) an added special token. Throws
// DataError naming the file and the token, or merges.txt's line.
std::string gpt2TokenizerJson(const std::string& vocab, const std::string& vocabOrigin, const std::string& merges,
                              const std::string& mergesOrigin);

// The tokenizer.json equivalent of BERT's vocab.txt (one token a line, its
// id the line's index from 0): BertNormalizer (lower-casing and stripping
// accents when `lowercase`), BertPreTokenizer, WordPiece with "##" and
// [UNK]; [PAD] [UNK] [CLS] [SEP] [MASK] as added special tokens. Throws
// DataError naming the file and line.
std::string wordPieceTokenizerJson(const std::string& vocab, const std::string& origin, bool lowercase);

}  // namespace cohort::data::detail
