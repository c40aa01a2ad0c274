#include "serve/detail/openai_request.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace cohort::serve::detail {

namespace {

using nlohmann::json;

OpenAIError badField(const std::string& message, const std::string& param, const std::string& code = "") {
  return OpenAIError(400, message, param, code);
}

json parseOpenAIBody(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) {
    throw badField("We could not parse the JSON body of your request: it is not valid JSON.", "");
  }
  if (!j.is_object()) throw badField("The body of the request must be a JSON object.", "");
  return j;
}

// An optional field: absent or null is the default.
const json* optionalField(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

void refuseUnknownKeys(const json& j, const std::set<std::string>& known) {
  for (const auto& [key, value] : j.items()) {
    if (!known.count(key)) throw badField(fmt::format("Unrecognized request argument supplied: {}", key), key);
  }
}

int64_t integerIn(const json& v, const char* key, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw badField(fmt::format("'{}' must be an integer, got {}", key, v.dump()), key);
  const bool above = v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi) : v.get<int64_t>() > hi;
  // A JSON number >= 0 is read as unsigned.
  const bool below = v.is_number_unsigned() ? lo > 0 && v.get<uint64_t>() < static_cast<uint64_t>(lo)
                                            : v.get<int64_t>() < lo;
  if (above || below) {
    throw badField(fmt::format("'{}' is {}: it must be in [{}, {}]", key, v.dump(), lo, hi), key);
  }
  return v.get<int64_t>();
}

double numberIn(const json& v, const char* key, double lo, double hi, bool openLow = false) {
  if (!v.is_number()) throw badField(fmt::format("'{}' must be a number, got {}", key, v.dump()), key);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || (openLow ? x <= lo : x < lo)) {
    throw badField(fmt::format("'{}' is {}: it must be in {}{}, {}]", key, v.dump(), openLow ? "(" : "[", lo, hi), key);
  }
  return x;
}

bool booleanOf(const json& v, const char* key) {
  if (!v.is_boolean()) throw badField(fmt::format("'{}' must be true or false, got {}", key, v.dump()), key);
  return v.get<bool>();
}

// A field cohort takes only at its default (echo false, penalties 0, ...).
void onlyDefault(const json& j, const char* key, const json& neutral) {
  const json* v = optionalField(j, key);
  if (!v || *v == neutral || (v->is_number() && neutral.is_number() && v->get<double>() == neutral.get<double>()) ||
      (v->is_object() && v->empty())) {
    return;
  }
  throw badField(fmt::format("'{}' is not supported by cohort serve (only {} is taken)", key, neutral.dump()), key);
}

// What both routes share: the model, sampling, n, stop, stream.
void readCommon(const json& j, const ModelInfo& info, const OpenAILimits& limits, uint64_t defaultSeed,
                OpenAIRequest& r) {
  const json* model = optionalField(j, "model");
  if (!model) throw badField("you must provide a model parameter", "model");
  if (!model->is_string()) throw badField("'model' must be a string", "model");
  r.model = model->get<std::string>();
  if (r.model != limits.modelName) {
    throw OpenAIError(404, fmt::format("The model `{}` does not exist: this server serves `{}`", r.model,
                                       limits.modelName),
                      "model", "model_not_found");
  }
  if (!info.tokens) {
    throw badField(info.texts ? "this model classifies texts: POST /v1/predict"
                             : "this is an image model: POST /v1/predict",
                  "model");
  }
  GenerateRequest& g = r.generate;
  if (const json* v = optionalField(j, "temperature")) g.sampling.temperature = numberIn(*v, "temperature", 0, 2);
  if (const json* v = optionalField(j, "top_p")) g.sampling.topP = numberIn(*v, "top_p", 0, 1, true);
  if (const json* v = optionalField(j, "top_k")) g.sampling.topK = integerIn(*v, "top_k", 0, info.vocabSize);
  if (const json* v = optionalField(j, "n")) r.n = integerIn(*v, "n", 1, kMaxChoices);
  g.sampling.seed = defaultSeed;
  if (const json* v = optionalField(j, "seed")) {
    if (!v->is_number_integer()) throw badField(fmt::format("'seed' must be an integer, got {}", v->dump()), "seed");
    // A negative seed is taken as its two's complement: distinct seeds stay distinct.
    g.sampling.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  if (const json* v = optionalField(j, "stop")) {
    const json list = v->is_string() ? json::array({*v}) : *v;
    if (!list.is_array() || list.size() > 16) {
      throw badField("'stop' must be a string or a list of at most 16 strings", "stop");
    }
    for (const json& one : list) {
      if (!one.is_string() || one.get<std::string>().empty() || one.get<std::string>().size() > 256) {
        throw badField("'stop' strings must be non-empty strings of at most 256 bytes", "stop");
      }
      g.stops.push_back(one.get<std::string>());
    }
  }
  if (const json* v = optionalField(j, "stream")) g.stream = booleanOf(*v, "stream");
  if (const json* v = optionalField(j, "stream_options")) {
    if (!v->is_object()) throw badField("'stream_options' must be an object", "stream_options");
    if (!g.stream) throw badField("'stream_options' is only allowed when 'stream' is true", "stream_options");
    for (const auto& [key, value] : v->items()) {
      if (key != "include_usage") {
        throw badField(fmt::format("Unrecognized stream option: {}", key), "stream_options." + key);
      }
      if (!value.is_null()) r.includeUsage = booleanOf(value, "stream_options.include_usage");
    }
  }
  if (const json* v = optionalField(j, "user"); v && !v->is_string()) throw badField("'user' must be a string", "user");
  onlyDefault(j, "presence_penalty", 0);
  onlyDefault(j, "frequency_penalty", 0);
  onlyDefault(j, "logit_bias", json::object());
}

int64_t maxTokensOf(const json& v, const char* key, const OpenAILimits& limits) {
  if (!v.is_number_integer()) throw badField(fmt::format("'{}' must be an integer, got {}", key, v.dump()), key);
  const bool negative = !v.is_number_unsigned() && v.get<int64_t>() < 0;
  if (negative || v.get<uint64_t>() > static_cast<uint64_t>(limits.maxNewTokens)) {
    throw badField(fmt::format("'{}' is {}: it must be in [0, {}] (--max-new-tokens)", key, v.dump(),
                              limits.maxNewTokens),
                  key);
  }
  return v.get<int64_t>();
}

// The prompt's ids checked against the model: 400 with OpenAI's
// context_length_exceeded when longer than block_size.
void checkPromptIds(const std::vector<int64_t>& ids, const ModelInfo& info, const char* param) {
  if (ids.empty()) throw badField("the prompt encodes to no tokens with this model's tokenizer", param);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= info.vocabSize) {
      throw badField(fmt::format("the prompt's token {} is id {}: the model's vocabulary is 0..{}", i, ids[i],
                                info.vocabSize - 1),
                    param);
    }
  }
  if (static_cast<int64_t>(ids.size()) > info.blockSize) {
    throw badField(fmt::format("This model's maximum context length is {} tokens. However, your prompt is {} "
                              "tokens. Please shorten it.",
                              info.blockSize, ids.size()),
                  param, "context_length_exceeded");
  }
}

}  // namespace

std::string openAIErrorType(int status) {
  if (status == 401) return "authentication_error";
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

std::string openAIErrorBody(int status, const std::string& message, const std::string& param,
                            const std::string& code) {
  const json error{{"message", message},
                   {"type", openAIErrorType(status)},
                   {"param", param.empty() ? json(nullptr) : json(param)},
                   {"code", code.empty() ? json(nullptr) : json(code)}};
  return dumpJson(json{{"error", error}});
}

OpenAIRequest parseCompletion(const std::string& body, const ModelInfo& info, const OpenAILimits& limits,
                              uint64_t defaultSeed) {
  const json j = parseOpenAIBody(body);
  refuseUnknownKeys(j, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options",
                "stop", "seed", "logprobs", "echo", "suffix", "best_of", "logit_bias", "user", "presence_penalty",
                "frequency_penalty"});
  OpenAIRequest r;
  readCommon(j, info, limits, defaultSeed, r);
  onlyDefault(j, "echo", false);
  onlyDefault(j, "suffix", "");
  if (const json* v = optionalField(j, "best_of"); v && *v != json(r.n)) {
    throw badField("'best_of' is not supported by cohort serve (only best_of = n)", "best_of");
  }
  GenerateRequest& g = r.generate;
  const json* prompt = optionalField(j, "prompt");
  if (!prompt) throw badField("you must provide a prompt parameter", "prompt");
  const json one = prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string() ? (*prompt)[0] : *prompt;
  if (one.is_string()) {
    std::string text = one.get<std::string>();
    if (text.empty()) text = "\n";  // as /v1/generate and `cohort generate`
    r.promptBytes = text.size();
    g.prompt = textTokenizer(info).encode(text);
  } else if (one.is_array() && !one.empty() && std::all_of(one.begin(), one.end(), [](const json& t) {
               return t.is_number_integer();
             })) {
    for (const json& t : one) g.prompt.push_back(t.get<int64_t>());
    std::vector<int64_t> ids = g.prompt;
    for (int64_t& id : ids) id = std::clamp<int64_t>(id, 0, info.vocabSize - 1);
    r.promptBytes = textTokenizer(info).decode(ids).size();
  } else {
    throw badField("'prompt' must be a string, a list of one string, or a list of token ids (one prompt per request)",
                  "prompt");
  }
  checkPromptIds(g.prompt, info, "prompt");
  g.maxTokens = std::min<int64_t>(16, limits.maxNewTokens);
  if (const json* v = optionalField(j, "max_tokens")) g.maxTokens = maxTokensOf(*v, "max_tokens", limits);
  if (const json* v = optionalField(j, "logprobs")) g.logprobs = integerIn(*v, "logprobs", 0, kMaxCompletionLogprobs);
  return r;
}

OpenAIRequest parseChat(const std::string& body, const ModelInfo& info, const OpenAILimits& limits,
                        const ChatTemplate& chat, uint64_t defaultSeed) {
  const json j = parseOpenAIBody(body);
  refuseUnknownKeys(j, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n",
                "stream", "stream_options", "stop", "seed", "logprobs", "top_logprobs", "user", "presence_penalty",
                "frequency_penalty", "logit_bias"});
  OpenAIRequest r;
  r.chat = true;
  readCommon(j, info, limits, defaultSeed, r);
  const json* messages = optionalField(j, "messages");
  if (!messages) throw badField("you must provide a messages parameter", "messages");
  if (!messages->is_array() || messages->empty()) throw badField("'messages' must be a non-empty list", "messages");
  std::vector<ChatMessage> turns;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string at = fmt::format("messages.[{}]", i);
    if (!m.is_object()) throw badField(fmt::format("'{}' must be an object", at), at);
    for (const auto& [key, value] : m.items()) {
      if (key != "role" && key != "content" && key != "name") {
        throw badField(fmt::format("'{}.{}' is not supported by cohort serve", at, key), at + "." + key);
      }
    }
    const json* role = optionalField(m, "role");
    if (!role || !role->is_string()) throw badField(fmt::format("'{}.role' must be a string", at), at + ".role");
    ChatMessage turn{role->get<std::string>(), ""};
    if (turn.role == "developer") turn.role = "system";
    if (turn.role != "system" && turn.role != "user" && turn.role != "assistant") {
      throw badField(fmt::format("'{}.role' is '{}': cohort serve takes system, developer, user and assistant", at,
                                role->get<std::string>()),
                    at + ".role");
    }
    const json* content = optionalField(m, "content");
    if (!content) throw badField(fmt::format("'{}.content' is missing: every message needs content", at), at + ".content");
    if (content->is_string()) {
      turn.content = content->get<std::string>();
    } else if (content->is_array() && !content->empty()) {
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          throw badField(fmt::format("'{}.content' parts must be {{\"type\": \"text\", \"text\": ...}}", at),
                        at + ".content");
        }
        turn.content += part["text"].get<std::string>();
      }
    } else {
      throw badField(fmt::format("'{}.content' must be a string or a non-empty list of text parts", at),
                    at + ".content");
    }
    if (const json* name = optionalField(m, "name"); name && !name->is_string()) {
      throw badField(fmt::format("'{}.name' must be a string", at), at + ".name");
    }
    turns.push_back(std::move(turn));
  }
  GenerateRequest& g = r.generate;
  const std::string prompt = chat.render(turns);
  r.promptBytes = prompt.size();
  g.prompt = textTokenizer(info).encode(prompt);
  checkPromptIds(g.prompt, info, "messages");
  for (const std::string& s : chat.stops()) g.stops.push_back(s);
  g.maxTokens = std::min<int64_t>(256, limits.maxNewTokens);
  if (const json* v = optionalField(j, "max_completion_tokens")) g.maxTokens = maxTokensOf(*v, "max_completion_tokens", limits);
  if (const json* v = optionalField(j, "max_tokens")) g.maxTokens = maxTokensOf(*v, "max_tokens", limits);
  bool logprobs = false;
  if (const json* v = optionalField(j, "logprobs")) logprobs = booleanOf(*v, "logprobs");
  if (const json* v = optionalField(j, "top_logprobs")) {
    if (!logprobs) throw badField("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    g.logprobs = integerIn(*v, "top_logprobs", 0, kMaxChatTopLogprobs);
  } else if (logprobs) {
    g.logprobs = 0;
  }
  return r;
}

}  // namespace cohort::serve::detail
