#pragma once

// How text becomes token ids and back (docs/token-format.md): the byte
// tokenizer (each byte a token: any text, UTF-8 or not, tokenizes, and every
// sequence decodes), a SentencePiece model (the library LLaMA and T5 use,
// Debian's libsentencepiece), or a Hugging Face tokenizer.json (BPE as GPT-2
// and Llama-style files have it, WordPiece as BERT's), which GPT-2's
// vocab.json + merges.txt and BERT's vocab.txt are read as; each is stored
// with the token dataset.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cohort::data {

inline constexpr const char* kByteTokenizer = "bytes";
inline constexpr int64_t kByteVocabSize = 256;
inline constexpr const char* kSentencePieceTokenizer = "sentencepiece";
// The model's file name in a token dataset.
inline constexpr const char* kTokenizerModelFile = "tokenizer.model";
// A Hugging Face tokenizer.json (its model() is the file's text).
inline constexpr const char* kHuggingFaceTokenizer = "huggingface";
inline constexpr const char* kTokenizerJsonFile = "tokenizer.json";

// The file a token dataset keeps tokenizer `name`'s model in
// (kTokenizerModelFile or kTokenizerJsonFile).
std::string tokenizerModelFile(const std::string& name);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual const std::string& name() const = 0;
  virtual int64_t vocabSize() const = 0;
  // Thread-safe.
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // Throws DataError for an id outside the vocabulary.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // The serialized model ("" for the byte tokenizer): what a dataset and
  // an export carry.
  virtual const std::string& model() const = 0;
  // The id of `token` spelled as in the tokenizer's files ("[CLS]",
  // "<|endoftext|>", "<s>", "Ġthe"): an added token's or a vocabulary
  // entry's; -1 when it has none.
  virtual int64_t tokenId(const std::string& token) const {
    (void)token;
    return -1;
  }
  // The special tokens (tokenizer.json's added tokens marked "special";
  // BERT's [PAD] [UNK] [CLS] [SEP] [MASK] for a vocab.txt), by id. encode()
  // matches them in the text whole, and never adds them itself.
  virtual std::vector<std::pair<std::string, int64_t>> specialTokens() const { return {}; }
};

// The byte tokenizer, shared.
std::shared_ptr<const Tokenizer> byteTokenizer();

// `name` with its serialized model (`model`: empty for bytes). Throws
// DataError naming `origin` for an unknown name or a model that does not
// load.
std::shared_ptr<const Tokenizer> makeTokenizer(const std::string& name, const std::string& model,
                                               const std::string& origin);

struct TokenizerFileOptions {
  // GPT-2's merges for a vocab.json; "": merges.txt (or vocab.bpe) beside it.
  std::string merges;
  // A vocab.txt lower-cases and strips accents, as bert-base-uncased.
  bool lowercase = true;
};

// The tokenizer in file `path`, by its kind:
//   *.json with a "model": Hugging Face's tokenizer.json;
//   *.json of token: id only: GPT-2's vocab.json (a.k.a. encoder.json),
//     with options.merges or the merges.txt (vocab.bpe) beside it;
//   *.txt: BERT's WordPiece vocab.txt (options.lowercase);
//   *.model: a SentencePiece model;
//   a directory: loadTokenizerDirectory.
// GPT-2's and BERT's files come back as the equivalent tokenizer.json
// (name() kHuggingFaceTokenizer, model() its text). Reads the files once,
// keeps nothing open. Throws DataError naming the file and the field (and
// merges.txt's line) for what is malformed, missing or not implemented.
std::shared_ptr<const Tokenizer> loadTokenizerFile(const std::string& path, const TokenizerFileOptions& options = {});

// The tokenizer of a Hugging Face model directory: the first there of
// tokenizer.json, vocab.json (+ merges.txt), vocab.txt (lower-cased unless
// tokenizer_config.json says "do_lower_case": false), tokenizer.model.
// Throws DataError naming the directory when it has none, else as
// loadTokenizerFile.
std::shared_ptr<const Tokenizer> loadTokenizerDirectory(const std::string& dir,
                                                        const TokenizerFileOptions& options = {});

class ShardSource;

// The tokenizer of a token dataset: its dataset.json's, with the model file
// it names checked against the recorded checksum and vocab_size. Throws
// DataError naming the file when it is missing, another model than the one
// the tokens were made with, or of another vocabulary.
std::shared_ptr<const Tokenizer> datasetTokenizer(const ShardSource& source);

struct SentencePieceTraining {
  int64_t vocabSize = 8000;
  std::string modelType = "bpe";  // bpe | unigram
  int threads = 0;                // 0: the machine's
};

// Trains a SentencePiece model on `text` (its lines are the sentences) so
// that decode(encode(x)) == x for any text: no normalization, whitespace
// kept as it is, no dummy prefix, bytes beyond the pieces as byte tokens,
// newline a byte token. Returns the serialized model. Throws UsageError for
// bad settings, DataError when the text cannot give `vocabSize` pieces.
std::string trainSentencePiece(const std::string& text, const SentencePieceTraining& s);

}  // namespace cohort::data
