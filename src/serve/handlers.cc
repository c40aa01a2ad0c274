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
#include "serve/detail/request.h"

namespace cohort::serve::detail {

namespace {

using nlohmann::json;

// How long a handler waits for the model thread before it answers 500: only
// reached when a forward hangs.
constexpr auto kResultTimeout = std::chrono::minutes(5);
// Below this temperature sampling is the most likely token (dividing the
// logits by less overflows float).
constexpr double kGreedyTemperature = 1e-4;

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dumpJson(body), "application/json");
}

void replyError(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(errorBody(message), "application/json");
}

std::optional<std::string> param(const httplib::Request& req, const char* key) {
  if (!req.has_param(key)) return std::nullopt;
  return req.get_param_value(key);
}

// A request counted in flight while the returned token lives (a streamed
// answer keeps it until its last chunk); nullptr after answering 503
// (draining) or 429 (max concurrency).
std::shared_ptr<void> admit(ServeState& s, httplib::Response& res) {
  if (s.draining.load()) {
    replyError(res, 503, "the server is shutting down");
    return nullptr;
  }
  if (s.metrics.inFlight.fetch_add(1) >= s.options.maxConcurrency) {
    s.metrics.inFlight.fetch_sub(1);
    replyError(res, 429, fmt::format("too many requests in flight (at most {})", s.options.maxConcurrency));
    return nullptr;
  }
  class Slot {
   public:
    explicit Slot(std::atomic<int64_t>& inFlight) : inFlight_(inFlight) {}
    ~Slot() { inFlight_.fetch_sub(1); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    std::atomic<int64_t>& inFlight_;
  };
  return std::make_shared<Slot>(s.metrics.inFlight);
}

at::Tensor waitResult(std::future<at::Tensor>& f) {
  if (f.wait_for(kResultTimeout) != std::future_status::ready) {
    throw Error("the model did not answer within 5 minutes");
  }
  return f.get();
}

void predict(ServeState& s, const httplib::Request& req, httplib::Response& res) {
  const auto slot = admit(s, res);
  if (!slot) return;
  if (s.info.tokens) {
    replyError(res, 400, "this is a language model: POST /v1/generate");
    return;
  }
  PredictRequest p;
  try {
    p = parsePredict(req.body, req.get_header_value("Content-Type"), param(req, "top_k"),
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
    const at::Tensor logits = waitResult(f);
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

// One generation: the prompt and the tokens so far, sampled one at a time
// through the batcher (contexts of the same length run together).
struct Generation {
  GenerateRequest request;
  std::vector<int64_t> tokens;  // the prompt, then the generated ones
  int64_t generated = 0;
  at::Generator generator;

  Generation(GenerateRequest r)
      : request(std::move(r)), tokens(request.prompt),
        generator(at::make_generator<at::CPUGeneratorImpl>(request.seed)) {}

  bool done() const { return generated >= request.maxTokens; }

  // Samples and appends the next token, as `cohort generate` does. Throws
  // Error when the queue is full.
  int64_t step(ServeState& s) {
    const size_t block = static_cast<size_t>(s.info.blockSize);
    const size_t start = tokens.size() > block ? tokens.size() - block : 0;
    const std::vector<int64_t> context(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end());
    auto futures = s.batcher.submit({torch::tensor(context, torch::kInt64)});
    if (futures.empty()) throw Error("the queue of inputs is full; retry later");
    const int64_t vocab = s.info.tokenizerVocab > 0 ? std::min(s.info.tokenizerVocab, s.info.vocabSize)
                                                    : s.info.vocabSize;
    at::Tensor logits = waitResult(futures[0]).narrow(0, 0, vocab);
    int64_t next = 0;
    if (request.temperature < kGreedyTemperature) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / request.temperature;
      if (request.topK > 0 && request.topK < logits.size(0)) {
        const at::Tensor kth = std::get<0>(logits.topk(request.topK)).index({request.topK - 1});
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(torch::softmax(logits, 0), 1, false, generator).item<int64_t>();
    }
    tokens.push_back(next);
    ++generated;
    return next;
  }

  std::vector<int64_t> completion() const {
    return {tokens.end() - static_cast<std::ptrdiff_t>(generated), tokens.end()};
  }

  json summary(const ServeState& s) const {
    const std::vector<int64_t> out = completion();
    return {{"text", data::decodeTokens(s.info.tokenizer, out)}, {"tokens", out},
            {"prompt_tokens", request.prompt.size()}, {"finish_reason", "length"}};
  }
};

void generate(ServeState& s, const httplib::Request& req, httplib::Response& res) {
  auto slot = admit(s, res);
  if (!slot) return;
  if (!s.info.tokens) {
    replyError(res, 400, "this is an image model: POST /v1/predict");
    return;
  }
  std::shared_ptr<Generation> g;
  try {
    g = std::make_shared<Generation>(parseGenerate(req.body, s.info, s.options.maxNewTokens));
  } catch (const DataError& e) {
    replyError(res, 400, e.what());
    return;
  }
  if (!g->request.stream) {
    try {
      while (!g->done()) g->step(s);
    } catch (const Error& e) {
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
        std::string line;
        if (g->done()) {
          json last = g->summary(s);
          last["done"] = true;
          line = dumpJson(last) + "\n";
          sink.write(line.data(), line.size());
          sink.done();
          return true;
        }
        try {
          const int64_t token = g->step(s);
          line = dumpJson({{"token", token}, {"text", data::decodeTokens(s.info.tokenizer, {token})}}) + "\n";
        } catch (const std::exception& e) {
          line = errorBody(e.what()) + "\n";
          sink.write(line.data(), line.size());
          sink.done();
          return true;
        }
        return sink.write(line.data(), line.size());
      });
}

// Runs `handler`; whatever it throws becomes a 500 with the message.
template <class F>
httplib::Server::Handler guarded(ServeState& s, F handler) {
  return [&s, handler](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(s, req, res);
    } catch (const std::exception& e) {
      log::warn("serve: {} {}: {}", req.method, req.path, e.what());
      replyError(res, 500, e.what());
    }
  };
}

}  // namespace

void addRoutes(httplib::Server& server, ServeState& state) {
  server.Post("/v1/predict", guarded(state, predict));
  server.Post("/v1/generate", guarded(state, generate));
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
