#pragma once

// cohort serve's OpenAI API (docs/deploy.md, "The OpenAI API"):
// POST /v1/completions, POST /v1/chat/completions, GET /v1/models and
// GET /v1/models/{id}, over the same generations as /v1/generate
// (generation.h). Their errors are OpenAI's error object
// (openai_request.h), 401 included (server.cc asks isOpenAIPath).

#include <httplib.h>

#include <string>

#include "serve/detail/handlers.h"

namespace cohort::serve::detail {

// Registers the routes. Reads the chat template beside the model
// (ChatTemplate::forModel) and logs which one is used; throws DataError for
// an unreadable tokenizer_config.json.
void addOpenAIRoutes(httplib::Server& server, ServeState& state);

// The served model's name: --model-name, else the base name of MODEL
// ("runs/tiny-gpt/" -> "tiny-gpt").
std::string servedModelName(const ServeOptions& options);

// Whether `path` is one of the OpenAI routes.
bool isOpenAIPath(const std::string& path);

// An error in OpenAI's shape, its code from the status (401
// invalid_api_key, 413 request_too_large, 429 rate_limit_exceeded, 503
// service_unavailable).
void replyOpenAIError(httplib::Response& res, int status, const std::string& message);

}  // namespace cohort::serve::detail
