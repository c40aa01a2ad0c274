#include "serve/detail/handlers.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/data/tokens.h"
#include "cohort/infer/decoding.h"
#include "serve/detail/generation.h"
#include "serve/detail/openai.h"
#include "serve/detail/request.h"

namespace cohort::serve::detail {

namespace {

using nlohmann::json;

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dumpJson(body), "application/json");
}

// A query parameter (?key=): the body is ours (read by withBody), never
// parsed into req.params, so these are the URL's only.
std::optional<std::string> param(const httplib::Request& req, const char* key) {
  if (!req.has_param(key)) return std::nullopt;
  return req.get_param_value(key);
}

void predict(ServeState& s, const httplib::Request& req, const std::string& body, httplib::Response& res) {
  const auto slot = admit(s, res);
  if (!slot) return;
  if (s.info.tokens) {
    replyError(res, 400, "this is a language model: POST /v1/generate");
    return;
  }
  PredictRequest p;
  try {
    p = s.info.texts ? parseTextPredict(body, s.info, s.options.topK, s.options.maxQueue)
                     : parsePredict(body, req.get_header_value("Content-Type"), param(req, "top_k"),
                                    param(req, "logits"), s.info, s.options.topK, s.options.maxQueue);
  } catch (const DataError& e) {
    replyError(res, 400, e.what());
    return;
  }
  std::vector<std::future<at::Tensor>> futures = s.batcher.submit(std::move(p.inputs));
  if (futures.empty()) {
    replyError(res, 503, "the queue of inputs is full; retry later");
    return;
  }
  json predictions = json::array();
  for (auto& f : futures) {
    at::Tensor logits;
    try {
      logits = waitResult(s, f);
    } catch (const Unavailable& e) {
      replyError(res, 503, e.what());
      return;
    }
    const at::Tensor probs = torch::softmax(logits, 0);
    const auto [values, labels] = probs.topk(p.topK);
    json top = json::array();
    for (int64_t k = 0; k < p.topK; ++k) {
      const int64_t label = labels[k].item<int64_t>();
      top.push_back({{"label", label}, {"name", s.info.className(label)},
                     {"probability", values[k].item<float>()}});
    }
    json one{{"top_k", top}};
    if (p.logits) {
      const float* l = logits.data_ptr<float>();
      one["logits"] = std::vector<float>(l, l + logits.numel());
    }
    predictions.push_back(std::move(one));
  }
  reply(res, 200, {{"model", s.info.arch}, {"predictions", predictions}});
}

void generate(ServeState& s, const httplib::Request&, const std::string& body, httplib::Response& res) {
  auto slot = admit(s, res);
  if (!slot) return;
  if (!s.info.tokens) {
    replyError(res, 400, s.info.texts ? "this model classifies texts: POST /v1/predict" : "this is an image model: POST /v1/predict");
    return;
  }
  std::shared_ptr<Generation> g;
  try {
    g = std::make_shared<Generation>(
        parseGenerate(body, s.info, s.options.maxNewTokens, s.options.truncatePrompt), s, s.decodes);
  } catch (const DataError& e) {
    replyError(res, 400, e.what());
    return;
  }
  if (!g->request.stream) {
    // A failed forward propagates: guarded answers it 500.
    try {
      while (!g->done()) g->step(s);
    } catch (const Unavailable& e) {
      replyError(res, 503, e.what());
      return;
    }
    reply(res, 200, g->summary(s));
    return;
  }
  // Streamed: one JSON line per token, then the summary with "done": true.
  // The slot lives in the provider, so the request counts in flight until
  // its last line.
  res.set_chunked_content_provider(
      "application/x-ndjson", [&s, g, slot](size_t, httplib::DataSink& sink) {
        // A client that went away: its generation leaves the batch (and its
        // cache's blocks go back) at the scheduler's next iteration.
        if (!sink.is_writable()) {
          g->cancel();
          return false;
        }
        std::string line;
        if (g->done()) {
          json last = g->summary(s);
          last["done"] = true;
          line = g->settledLines(s) + dumpJson(last) + "\n";
          sink.write(line.data(), line.size());
          sink.done();
          return true;
        }
        try {
          g->step(s);
          line = g->done() ? "" : g->settledLines(s);
          if (line.empty()) return true;  // held back: the next token tells
        } catch (const std::exception& e) {
          line = errorBody(e.what()) + "\n";
          sink.write(line.data(), line.size());
          sink.done();
          return true;
        }
        if (!sink.write(line.data(), line.size())) {
          g->cancel();
          return false;
        }
        return true;
      });
}

}  // namespace

void replyError(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(errorBody(message), "application/json");
}

std::shared_ptr<void> admit(ServeState& s, httplib::Response& res, ErrorReply error) {
  if (s.draining.load()) {
    error(res, 503, "the server is shutting down");
    return nullptr;
  }
  if (s.metrics.inFlight.fetch_add(1) >= s.options.maxConcurrency) {
    s.metrics.inFlight.fetch_sub(1);
    error(res, 429, fmt::format("too many requests in flight (at most {})", s.options.maxConcurrency));
    return nullptr;
  }
  class Slot {
   public:
    explicit Slot(ServeState& s) : s_(s) {}
    ~Slot() {
      s_.metrics.inFlight.fetch_sub(1);
      s_.batcher.requestDone();  // a batch may have waited for this request to join
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    ServeState& s_;
  };
  return std::make_shared<Slot>(s);
}

httplib::Server::HandlerWithContentReader withBody(ServeState& s, BodyHandler handler, ErrorReply error) {
  return [&s, handler, error](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    const auto limit = static_cast<size_t>(s.options.maxBodyBytes);
    std::string body;
    bool tooLarge = false;
    size_t discarded = 0;
    auto receive = [&](const char* data, size_t n) {
      if (!tooLarge && body.size() + n <= limit) {
        body.append(data, n);
        return true;
      }
      // Beyond the bound: read on (up to as much again) without keeping it,
      // so that the client, still sending, reads the 413 rather than a reset.
      tooLarge = true;
      body.clear();
      discarded += n;
      return discarded <= limit;
    };
    const bool multipart = req.is_multipart_form_data();
    // A multipart body goes through httplib's multipart parser whatever
    // receiver is given: read it (bounded) only to keep the connection usable.
    const bool read = multipart ? reader([](const httplib::MultipartFormData&) { return true; }, receive)
                                : reader(receive);
    // httplib answers a Content-Length beyond set_payload_max_length (the
    // same bound) 413 without reading; `receive` catches chunked bodies.
    if (tooLarge || res.status == 413) {
      res.set_header("Connection", "close");
      error(res, 413, fmt::format("the body is larger than {} bytes (--max-body-bytes)", limit));
      return;
    }
    if (!read) {
      res.set_header("Connection", "close");
      error(res, 400, "the body could not be read (cut short, or a malformed encoding)");
      return;
    }
    if (multipart) {
      error(res, 415, "multipart/form-data is not taken: send JSON (Content-Type: application/json) "
                           "or the bytes of one image");
      return;
    }
    try {
      handler(s, req, body, res);
    } catch (const std::exception& e) {
      log::warn("serve: {} {}: {}", req.method, req.path, e.what());
      error(res, 500, e.what());
    }
  };
}

void addRoutes(httplib::Server& server, ServeState& state) {
  server.Post("/v1/predict", withBody(state, predict));
  server.Post("/v1/generate", withBody(state, generate));
  addOpenAIRoutes(server, state);
  server.Get("/v1/model", [&state](const httplib::Request&, httplib::Response& res) {
    reply(res, 200, state.info.toJson());
  });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    reply(res, 200, {{"status", "ok"}});
  });
  server.Get("/readyz", [&state](const httplib::Request&, httplib::Response& res) {
    if (state.draining.load()) {
      reply(res, 503, {{"status", "draining"}});
    } else {
      reply(res, 200, {{"status", "ready"}});
    }
  });
  server.Get("/metrics", [&state](const httplib::Request&, httplib::Response& res) {
    res.set_content(state.metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

}  // namespace cohort::serve::detail
