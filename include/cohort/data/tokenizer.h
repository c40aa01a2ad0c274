#pragma once

// How text becomes token ids and back (docs/token-format.md): the byte
// tokenizer (each byte a token: any text, UTF-8 or not, tokenizes, and every
// sequence decodes) or a SentencePiece model (the library LLaMA and T5 use,
// Debian's libsentencepiece), stored with the token dataset.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cohort::data {

inline constexpr const char* kByteTokenizer = "bytes";
inline constexpr int64_t kByteVocabSize = 256;
inline constexpr const char* kSentencePieceTokenizer = "sentencepiece";
// The model's file name in a token dataset.
inline constexpr const char* kTokenizerModelFile = "tokenizer.model";

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
};

// The byte tokenizer, shared.
std::shared_ptr<const Tokenizer> byteTokenizer();

// `name` with its serialized model (`model`: empty for bytes). Throws
// DataError naming `origin` for an unknown name or a model that does not
// load.
std::shared_ptr<const Tokenizer> makeTokenizer(const std::string& name, const std::string& model,
                                               const std::string& origin);

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
