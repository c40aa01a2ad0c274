#pragma once

// The bodies `cohort serve` accepts, parsed into model inputs. Every parse
// error is a DataError whose message tells the client what is wrong (the
// server answers it as 400 {"error": message}). docs/deploy.md lists the
// forms.

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cohort/serve/model.h"
#include "cohort/serve/server.h"
#include "cohort/infer/decoding.h"

namespace cohort::serve::detail {

struct PredictRequest {
  std::vector<at::Tensor> inputs;  // each [C, H, W] float32, raw pixels 0..255
  int64_t topK = 5;                // at most the number of classes
  bool logits = false;             // answer the logits too
};

// POST /v1/predict of an image model. `body` is JSON ({"inputs": ...}) or the
// bytes of one JPEG or PNG image: image/jpeg and image/png content types are
// images, application/json is JSON, and any other type is sniffed (the
// JPEG and PNG signatures). `topKParam` and `logitsParam` are the query's
// ?top_k= and ?logits= (absent: std::nullopt); JSON keys of the same names
// take precedence. `maxInputs` bounds the inputs of one request.
// POST /v1/predict of a text classifier (ModelInfo::texts): JSON
// {"text": "..."} or {"texts": ["...", ...]}, with "top_k" and "logits" as
// for images. Each text becomes [CLS] text [SEP] padded with [PAD] (or cut)
// to the model's block_size, as its training texts were.
PredictRequest parseTextPredict(const std::string& body, const ModelInfo& info, int64_t defaultTopK,
                                int64_t maxInputs);

PredictRequest parsePredict(const std::string& body, const std::string& contentType,
                            const std::optional<std::string>& topKParam,
                            const std::optional<std::string>& logitsParam, const ModelInfo& info,
                            int64_t defaultTopK, int64_t maxInputs);

// parsePredict's JSON path without its fast reader (json_pixels.h): the
// general parser alone, which the fast reader must agree with.
PredictRequest parsePredictJsonGeneral(const std::string& body, const ModelInfo& info, int64_t defaultTopK,
                                       int64_t maxInputs);

struct GenerateRequest {
  std::vector<int64_t> prompt;  // token ids, 1 to block_size of them
  int64_t maxTokens = 16;
  infer::Sampling sampling;     // temperature 0: the most likely token every time
  std::vector<std::string> stops;  // the text ends before the first of them
  bool stream = false;
  // Log-probabilities of each sampled token and of the `logprobs` most
  // likely ones at its place (Generation::choices); -1: none recorded.
  int64_t logprobs = -1;
};

// A prompt of token ids for `info`'s model: ids within its vocabulary, at
// most block_size of them. A longer one is refused (DataError naming its
// length and the context) unless `truncate` is left: then its last
// block_size - 1 tokens are kept (room for one new token before the window
// first shifts).
void fitPrompt(std::vector<int64_t>& prompt, const ModelInfo& info, TruncatePrompt truncate);

// POST /v1/generate of a language model: {"prompt", "max_tokens",
// "temperature", "top_k", "top_p", "seed", "stop", "stream"}; only "prompt"
// is required; "stop" is a string or a list of at most 16 non-empty ones.
// `maxNewTokens` bounds max_tokens; the prompt goes through fitPrompt.
GenerateRequest parseGenerate(const std::string& body, const ModelInfo& info, int64_t maxNewTokens,
                              TruncatePrompt truncate = TruncatePrompt::none);

// JSON text for a client: invalid UTF-8 (a byte token cut from a character)
// becomes U+FFFD instead of failing.
std::string dumpJson(const nlohmann::json& j);

// {"error": message}
std::string errorBody(const std::string& message);

}  // namespace cohort::serve::detail
