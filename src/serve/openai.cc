// The OpenAI routes of `cohort serve`. Each choice of a request is one
// Generation (generation.h) stepped by this file: the n generations of a
// request step at the same time, one thread each, so their forwards join
// the same batches; a stream sends each token's text as soon as it cannot
// be the start of a stop string, as server-sent events.

#include "serve/detail/openai.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <ctime>
#include <filesystem>
#include <future>
#include <memory>
#include <random>
#include <vector>

#include "cohort/core/log.h"
#include "serve/detail/chat_template.h"
#include "serve/detail/generation.h"
#include "serve/detail/openai_request.h"

namespace cohort::serve::detail {

namespace {

using nlohmann::json;

struct OpenAIState {
  OpenAILimits limits;
  ChatTemplate chat;
  int64_t created = 0;  // the server's start: /v1/models' "created"
};

uint64_t randomSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

std::string randomId(const char* prefix) {
  return fmt::format("{}-{:016x}{:08x}", prefix, randomSeed(), static_cast<uint32_t>(randomSeed()));
}

void replyJson(httplib::Response& res, const json& body) {
  res.status = 200;
  res.set_content(dumpJson(body), "application/json");
}

void replyOpenAI(httplib::Response& res, const OpenAIError& e) {
  res.status = e.status;
  res.set_content(openAIErrorBody(e.status, e.what(), e.param, e.code), "application/json");
}

using Generations = std::vector<std::shared_ptr<Generation>>;

// Choice i samples with the request's seed + i.
Generations generationsOf(const OpenAIRequest& r, const ServeState& s) {
  Generations gens;
  for (int64_t i = 0; i < r.n; ++i) {
    GenerateRequest one = r.generate;
    one.sampling.seed += static_cast<uint64_t>(i);
    gens.push_back(std::make_shared<Generation>(std::move(one), s, s.decodes));
  }
  return gens;
}

// Runs `work(i)` for every i, all at once: i > 0 on threads of their own,
// 0 on this one, so that their forwards wait in the batcher together.
// Rethrows the first failure once all have returned.
template <class F>
void together(size_t n, F work) {
  std::vector<std::future<void>> others;
  for (size_t i = 1; i < n; ++i) others.push_back(std::async(std::launch::async, work, i));
  std::exception_ptr failed;
  try {
    if (n > 0) work(0);
  } catch (...) {
    failed = std::current_exception();
  }
  for (auto& f : others) {
    try {
      f.get();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

// What each of the completion's tokens [from, to) adds to the text before
// it (a tokenizer's piece may depend on its neighbours: a leading space).
std::vector<std::string> piecesOf(const Generation& g, const ServeState& s, size_t from, size_t to) {
  std::vector<std::string> pieces;
  std::string before = g.prefixText(s, from);
  for (size_t k = from; k < to; ++k) {
    std::string after = g.prefixText(s, k + 1);
    pieces.push_back(after.compare(0, before.size(), before) == 0 ? after.substr(before.size()) : after);
    before = std::move(after);
  }
  return pieces;
}

json bytesOf(const std::string& text) {
  json b = json::array();
  for (unsigned char c : text) b.push_back(c);
  return b;
}

// OpenAI's logprobs of tokens [from, from + pieces.size()): completions'
// {tokens, token_logprobs, top_logprobs, text_offset}, chat's {content: [...]}.
json logprobsOf(const OpenAIRequest& r, const Generation& g, const ServeState& s, size_t from,
                const std::vector<std::string>& pieces, size_t offset) {
  const data::Tokenizer& tok = textTokenizer(s.info);
  if (r.chat) {
    json content = json::array();
    for (size_t k = 0; k < pieces.size(); ++k) {
      const TokenChoice& c = g.choices.at(from + k);
      json top = json::array();
      for (const auto& [id, lp] : c.top) {
        const std::string t = tok.decode({id});
        top.push_back({{"token", t}, {"logprob", lp}, {"bytes", bytesOf(t)}});
      }
      content.push_back({{"token", pieces[k]}, {"logprob", c.logprob}, {"bytes", bytesOf(pieces[k])},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (size_t k = 0; k < pieces.size(); ++k) {
    const TokenChoice& c = g.choices.at(from + k);
    json top = json::object();
    for (const auto& [id, lp] : c.top) top[tok.decode({id})] = lp;
    tokens.push_back(pieces[k]);
    logprobs.push_back(c.logprob);
    tops.push_back(top);
    offsets.push_back(offset);
    offset += pieces[k].size();
  }
  return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

const char* finishReason(const Generation& g) { return g.stopped ? "stop" : "length"; }

json usageOf(const Generations& gens) {
  int64_t completion = 0;
  for (const auto& g : gens) completion += g->generated;
  const auto prompt = static_cast<int64_t>(gens.front()->promptTokens);
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

json answerOf(const OpenAIRequest& r, const Generations& gens, const ServeState& s) {
  json choices = json::array();
  for (size_t i = 0; i < gens.size(); ++i) {
    const Generation& g = *gens[i];
    json logprobs = nullptr;
    if (r.generate.logprobs >= 0) {
      // The tokens whose text is wholly in the answer (a stop string's are not).
      const size_t kept = g.stopped ? g.tokensWithin(s, g.text.size()) : g.completion().size();
      logprobs = logprobsOf(r, g, s, 0, piecesOf(g, s, 0, kept), r.promptBytes);
    }
    json choice{{"index", i}, {"logprobs", logprobs}, {"finish_reason", finishReason(g)}};
    if (r.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", g.text}};
    } else {
      choice["text"] = g.text;
    }
    choices.push_back(std::move(choice));
  }
  return {{"id", randomId(r.chat ? "chatcmpl" : "cmpl")},
          {"object", r.chat ? "chat.completion" : "text_completion"},
          {"created", static_cast<int64_t>(std::time(nullptr))},
          {"model", r.model},
          {"choices", choices},
          {"usage", usageOf(gens)}};
}

// A streamed answer: the generations, and what of each has been sent
// (Generation::sentTokens counts its tokens settled: sent, or pending inside a character).
struct OpenAIStream {
  OpenAIRequest request;
  Generations gens;
  std::string id;
  int64_t created = 0;
  std::vector<size_t> sentBytes;
  std::vector<bool> finished;
  bool opened = false;  // chat: each choice's first chunk (role) sent

  std::string event(json choice) const {
    json chunk{{"id", id},
               {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
               {"created", created},
               {"model", request.model},
               {"choices", json::array({std::move(choice)})}};
    return "data: " + dumpJson(chunk) + "\n\n";
  }
  std::string textEvent(size_t i, const std::string& text, json logprobs, json finish) const {
    const bool last = !finish.is_null();
    json choice{{"index", i}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}};
    if (request.chat) {
      choice["delta"] = last ? json::object() : json{{"content", text}};
    } else {
      choice["text"] = text;
    }
    return event(std::move(choice));
  }

  // The events of what generation i has settled since the last call: one
  // per token, and its end once done. A token that ends inside a UTF-8
  // character (a byte token, a byte-fallback piece) waits for the tokens
  // that complete it and goes out with them in one event: a client that
  // joins the events' texts gets the characters the whole text has.
  std::string settled(size_t i, const ServeState& s) {
    Generation& g = *gens[i];
    const auto& stops = request.generate.stops;
    const size_t ready = g.done() ? g.text.size() : g.text.size() - infer::stopPrefix(g.text, stops);
    const size_t from = g.sentTokens, upTo = g.tokensWithin(s, ready);
    const std::vector<std::string> pieces = piecesOf(g, s, from, upTo);
    std::string out;
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (pending[i].empty()) pendingFrom[i] = from + k;
      pending[i].push_back(pieces[k]);
      std::string text;
      for (const std::string& p : pending[i]) text += p;
      if (endsInsideCharacter(text)) continue;
      out += pendingEvent(i, s);
    }
    g.sentTokens = upTo;
    if (g.done()) {
      if (!pending[i].empty()) out += pendingEvent(i, s);
      // A token cut by a stop string: its text before the stop.
      if (sentBytes[i] < g.text.size()) out += textEvent(i, g.text.substr(sentBytes[i]), nullptr, nullptr);
      sentBytes[i] = g.text.size();
      out += textEvent(i, "", nullptr, finishReason(g));
      finished[i] = true;
    }
    return out;
  }

  // Whether `text` ends with the first bytes of a UTF-8 character, its
  // continuation bytes still to come.
  static bool endsInsideCharacter(const std::string& text) {
    const size_t n = text.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
      const auto c = static_cast<unsigned char>(text[n - back]);
      if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
      const size_t length = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      return c < 0xF8 && length > back;
    }
    return false;
  }

  // The event of generation i's pending tokens, joined.
  std::string pendingEvent(size_t i, const ServeState& s) {
    std::string text;
    for (const std::string& p : pending[i]) text += p;
    json logprobs = nullptr;
    if (request.generate.logprobs >= 0) {
      logprobs = logprobsOf(request, *gens[i], s, pendingFrom[i], pending[i], request.promptBytes + sentBytes[i]);
    }
    sentBytes[i] += text.size();
    pending[i].clear();
    return textEvent(i, text, std::move(logprobs), nullptr);
  }

  std::vector<std::vector<std::string>> pending;  // per choice: pieces held back inside a character
  std::vector<size_t> pendingFrom;                // the first one's token
};

void streamAnswer(ServeState& s, std::shared_ptr<OpenAIStream> st, std::shared_ptr<void> slot, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [&s, st, slot](size_t, httplib::DataSink& sink) {
        // The client is gone: end here, and the generations with it.
        if (!sink.is_writable()) return false;
        std::string out;
        const size_t n = st->gens.size();
        if (!st->opened && st->request.chat) {
          for (size_t i = 0; i < n; ++i) {
            out += st->event({{"index", i},
                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr},
                              {"finish_reason", nullptr}});
          }
        }
        st->opened = true;
        try {
          together(n, [&](size_t i) {
            if (!st->gens[i]->done()) st->gens[i]->step(s);
          });
        } catch (const std::exception& e) {
          const int status = dynamic_cast<const Unavailable*>(&e) ? 503 : 500;
          out += "data: " + openAIErrorBody(status, e.what()) + "\n\n";
          sink.write(out.data(), out.size());
          sink.done();
          return true;
        }
        bool all = true;
        for (size_t i = 0; i < n; ++i) {
          if (!st->finished[i]) out += st->settled(i, s);
          all = all && st->finished[i];
        }
        if (all) {
          if (st->request.includeUsage) {
            json chunk{{"id", st->id},
                       {"object", st->request.chat ? "chat.completion.chunk" : "text_completion"},
                       {"created", st->created},
                       {"model", st->request.model},
                       {"choices", json::array()},
                       {"usage", usageOf(st->gens)}};
            out += "data: " + dumpJson(chunk) + "\n\n";
          }
          out += "data: [DONE]\n\n";
          const bool sent = sink.write(out.data(), out.size());
          sink.done();
          return sent;
        }
        if (out.empty()) return true;  // held back: the next token tells
        return sink.write(out.data(), out.size());
      });
}

void complete(ServeState& s, const OpenAIState& o, bool chat, const std::string& body, httplib::Response& res) {
  auto slot = admit(s, res, replyOpenAIError);
  if (!slot) return;
  OpenAIRequest r;
  Generations gens;
  try {
    r = chat ? parseChat(body, s.info, o.limits, o.chat, randomSeed())
             : parseCompletion(body, s.info, o.limits, randomSeed());
    gens = generationsOf(r, s);
  } catch (const OpenAIError& e) {
    replyOpenAI(res, e);
    return;
  } catch (const DataError& e) {
    replyOpenAIError(res, 400, e.what());
    return;
  }
  if (r.generate.stream) {
    auto st = std::make_shared<OpenAIStream>();
    st->id = randomId(chat ? "chatcmpl" : "cmpl");
    st->created = static_cast<int64_t>(std::time(nullptr));
    st->sentBytes.assign(gens.size(), 0);
    st->finished.assign(gens.size(), false);
    st->pending.resize(gens.size());
    st->pendingFrom.assign(gens.size(), 0);
    st->gens = std::move(gens);
    st->request = std::move(r);
    streamAnswer(s, std::move(st), std::move(slot), res);
    return;
  }
  // A failed forward propagates: withBody answers it 500.
  try {
    together(gens.size(), [&](size_t i) {
      while (!gens[i]->done()) gens[i]->step(s);
    });
  } catch (const Unavailable& e) {
    replyOpenAIError(res, 503, e.what());
    return;
  }
  replyJson(res, answerOf(r, gens, s));
}

json modelObject(const OpenAIState& o) {
  return {{"id", o.limits.modelName}, {"object", "model"}, {"created", o.created}, {"owned_by", "cohort"}};
}

}  // namespace

std::string servedModelName(const ServeOptions& options) {
  if (!options.modelName.empty()) return options.modelName;
  std::filesystem::path p(options.model);
  while (!p.empty() && p.filename().empty() && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() ? options.model : name;
}

bool isOpenAIPath(const std::string& path) {
  return path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/models" ||
         path.rfind("/v1/models/", 0) == 0;
}

void replyOpenAIError(httplib::Response& res, int status, const std::string& message) {
  std::string code;
  if (status == 401) code = "invalid_api_key";
  if (status == 413) code = "request_too_large";
  if (status == 429) code = "rate_limit_exceeded";
  if (status == 503) code = "service_unavailable";
  res.status = status;
  res.set_content(openAIErrorBody(status, message, "", code), "application/json");
}

void addOpenAIRoutes(httplib::Server& server, ServeState& state) {
  auto o = std::make_shared<OpenAIState>();
  o->limits.modelName = servedModelName(state.options);
  o->limits.maxNewTokens = state.options.maxNewTokens;
  o->created = static_cast<int64_t>(std::time(nullptr));
  std::string note;
  o->chat = ChatTemplate::forModel(state.options.model, &note);
  if (state.info.tokens) log::info("serve: OpenAI API as model '{}'; chats through {}", o->limits.modelName, note);
  server.Post("/v1/completions",
              withBody(state, [o](ServeState& s, const httplib::Request&, const std::string& body,
                                  httplib::Response& res) { complete(s, *o, false, body, res); },
                       replyOpenAIError));
  server.Post("/v1/chat/completions",
              withBody(state, [o](ServeState& s, const httplib::Request&, const std::string& body,
                                  httplib::Response& res) { complete(s, *o, true, body, res); },
                       replyOpenAIError));
  server.Get("/v1/models", [o](const httplib::Request&, httplib::Response& res) {
    replyJson(res, {{"object", "list"}, {"data", json::array({modelObject(*o)})}});
  });
  server.Get("/v1/models/(.+)", [o](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != o->limits.modelName) {
      replyOpenAI(res, OpenAIError(404, fmt::format("The model `{}` does not exist: this server serves `{}`", id,
                                                   o->limits.modelName),
                                  "model", "model_not_found"));
      return;
    }
    replyJson(res, modelObject(*o));
  });
}

}  // namespace cohort::serve::detail
