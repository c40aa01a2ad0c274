#pragma once

// The bodies of cohort serve's OpenAI routes (POST /v1/completions, POST
// /v1/chat/completions; docs/deploy.md, "The OpenAI API"), parsed into the
// generations they ask for, and OpenAI's error object. Every refusal is an
// OpenAIError carrying the HTTP status, the offending field and OpenAI's
// error code, answered as {"error": {"message", "type", "param", "code"}}.

#include <cstdint>
#include <string>

#include "cohort/core/error.h"
#include "cohort/serve/model.h"
#include "serve/detail/chat_template.h"
#include "serve/detail/request.h"

namespace cohort::serve::detail {

// choices per request (n) at most: each is a generation of its own.
inline constexpr int64_t kMaxChoices = 16;
// top log-probabilities per token at most: OpenAI's bounds (5 for
// completions' logprobs, 20 for chat's top_logprobs).
inline constexpr int64_t kMaxCompletionLogprobs = 5;
inline constexpr int64_t kMaxChatTopLogprobs = 20;

// Bad input from a client: a DataError (as every refusal of outside input)
// with what OpenAI's error object needs.
class OpenAIError : public DataError {
 public:
  OpenAIError(int status, const std::string& message, std::string param = "", std::string code = "")
      : DataError(message), status(status), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string param;  // the request field at fault; "": null
  std::string code;   // OpenAI's code (model_not_found, context_length_exceeded, ...); "": null
};

// OpenAI's error type for an HTTP status: invalid_request_error for 4xx
// (authentication_error for 401, rate_limit_error for 429), server_error
// for 5xx.
std::string openAIErrorType(int status);
// {"error": {"message", "type", "param", "code"}}, param and code null when "".
std::string openAIErrorBody(int status, const std::string& message, const std::string& param = "",
                            const std::string& code = "");

struct OpenAILimits {
  std::string modelName;     // the one model served; another name: 404 model_not_found
  int64_t maxNewTokens = 1024;  // --max-new-tokens: max_tokens at most this
};

struct OpenAIRequest {
  bool chat = false;
  std::string model;
  // The first choice's generation: prompt ids, max_tokens, sampling (its
  // seed; choice i samples with seed + i), stop strings (a chat's with its
  // template's end of turn), stream, logprobs (-1: none; else how many top
  // tokens per place).
  GenerateRequest generate;
  int64_t n = 1;
  bool includeUsage = false;  // stream_options.include_usage: a last chunk with usage
  size_t promptBytes = 0;     // the prompt's text: where completions' text_offset begins
};

// POST /v1/completions: "model" and "prompt" (a string, a list of one
// string, or a list of token ids) required; "max_tokens" (16), "temperature"
// (1), "top_p", "n", "stream", "stream_options", "stop", "seed" (absent:
// `defaultSeed`), "logprobs" (0..5), "user"; "echo", "suffix", "best_of",
// "logit_bias" and the penalties only at their defaults. Throws
// OpenAIError.
OpenAIRequest parseCompletion(const std::string& body, const ModelInfo& info, const OpenAILimits& limits,
                              uint64_t defaultSeed);

// POST /v1/chat/completions: "model" and "messages" (each {"role": system,
// developer (as system), user or assistant, "content": a string or a list
// of {"type": "text", "text"}}) required; as completions but "max_tokens"
// (or "max_completion_tokens") defaults to min(256, --max-new-tokens),
// and "logprobs" is true/false with "top_logprobs" (0..20). The prompt is
// `chat.render(messages)`.
OpenAIRequest parseChat(const std::string& body, const ModelInfo& info, const OpenAILimits& limits,
                        const ChatTemplate& chat, uint64_t defaultSeed);

}  // namespace cohort::serve::detail
