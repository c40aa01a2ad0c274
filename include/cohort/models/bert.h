#pragma once

// BERT: a Transformer encoder (post-LayerNorm blocks of bidirectional
// self-attention and a GELU MLP over token, position and segment
// embeddings) with one of two heads:
//   - masked language modelling (numClasses 0): tokens [B, T] -> logits
//     [B, T, vocab_size] from a dense + GELU + LayerNorm transform and a
//     decoder tied to the token embedding, with its own bias;
//   - sequence classification (numClasses > 0): tokens [B, T] -> logits
//     [B, num_classes] from the first position ([CLS]) through the pooler
//     (dense + tanh) and a linear classifier.
// Positions holding padId are never attended to (the attention mask
// Hugging Face's models take, made from the tokens). Every token is of
// segment 0.
//
// Parameter names are Hugging Face's BertForMaskedLM and
// BertForSequenceClassification ones (bert.embeddings.word_embeddings,
// bert.encoder.layer.<n>.attention.self.query, ..., cls.predictions,
// bert.pooler, classifier), and so is the initialization (normal(0, 0.02),
// the padding token's embedding row zero, biases zero, LayerNorms one and
// zero): a Hugging Face BERT checkpoint loads into it (models/hf_bert.h).
//
// model.arch: bert builds it from the job's model.* keys (bertOptions).

#include <cstdint>
#include <memory>

#include "cohort/models/model.h"

namespace cohort::models {

struct BertOptions {
  int64_t vocabSize = 256;
  int64_t blockSize = 128;   // positions (max_position_embeddings)
  int64_t nLayer = 4;
  int64_t nHead = 4;
  int64_t nEmbd = 128;       // divisible by nHead
  int64_t intermediate = 512;
  int64_t typeVocab = 2;     // segments (token_type_embeddings)
  double normEps = 1e-12;
  double dropout = 0.0;      // embeddings, attention weights, residual branches, before the classifier
  int64_t numClasses = 0;    // 0: the masked-LM head
  int64_t padId = -1;        // < 0: no position is masked out
  bool recompute = false;
};

// The token embedding, which the masked-LM decoder is too, and the
// decoder's names for it and for its bias.
inline constexpr const char* kBertEmbeddingName = "bert.embeddings.word_embeddings.weight";
inline constexpr const char* kBertDecoderName = "cls.predictions.decoder.weight";
inline constexpr const char* kBertDecoderBiasName = "cls.predictions.decoder.bias";
inline constexpr const char* kBertBiasName = "cls.predictions.bias";

// The options model.* give (numClasses from model.num_classes with task
// classify); `vocabSize` replaces model.vocab_size when that is 0.
// intermediate_size 0 gives 4 n_embd, norm_eps 0 gives 1e-12.
BertOptions bertOptions(const ModelConfig& config, int64_t vocabSize, int64_t padId = -1);

// Throws ConfigError naming the model.* key when the options cannot work.
std::shared_ptr<Model> createBert(const BertOptions& options);

}  // namespace cohort::models
