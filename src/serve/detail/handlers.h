#pragma once

// The routes of `cohort serve` (docs/deploy.md, "Serving"): /v1/predict,
// /v1/generate, /v1/model, /healthz, /readyz, /metrics. Compiled with
// cpp-httplib's options (src/CMakeLists.txt, COHORT_HTTPLIB_SOURCES).

#include <httplib.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "cohort/serve/model.h"
#include "cohort/serve/server.h"
#include "serve/detail/batcher.h"
#include "serve/detail/serve_metrics.h"

namespace cohort::serve::detail {

class Scheduler;

// What the handlers share; owned by serveCommand, outlives the server.
struct ServeState {
  const ServeOptions& options;
  const ModelInfo& info;  // the predictor's; its forward is the batcher's alone
  Batcher& batcher;
  ServeMetrics& metrics;
  bool decodes = false;  // the predictor keeps a key/value cache: generations go through `scheduler`
  Scheduler* scheduler = nullptr;  // continuous batching (scheduler.h); set when `decodes`
  std::atomic<bool> draining{false};  // SIGTERM seen: new work gets 503
  // The drain limit (--drain-seconds) passed: work still waiting for the
  // model gets 503 (a stream its {"error"} line) at its next check.
  std::atomic<bool> stopping{false};
};

// Registers the routes on `server`. Every handler answers errors as JSON
// {"error": ...}: 400 for a body it cannot use, 413 for one beyond
// --max-body-bytes (whatever its Content-Type), 415 for multipart/form-data,
// 429 above max concurrency, 503 when the queue is full, the server drains,
// or the drain limit passed while waiting; 500 for a failed forward.
void addRoutes(httplib::Server& server, ServeState& state);

// How a route answers an error: `status` and `message` into `res`, in the
// route's error shape (replyError: {"error": message}; the OpenAI routes:
// OpenAI's error object).
using ErrorReply = void (*)(httplib::Response& res, int status, const std::string& message);
void replyError(httplib::Response& res, int status, const std::string& message);

// A request counted in flight while the returned token lives (a streamed
// answer keeps it until its last chunk); nullptr after answering 503
// (draining) or 429 (max concurrency) through `error`.
std::shared_ptr<void> admit(ServeState& s, httplib::Response& res, ErrorReply error = replyError);

// A POST route that reads its own body, whatever its Content-Type: httplib's
// reading would cap application/x-www-form-urlencoded (what `curl -d` sends)
// at 8 KiB, compiled into the library, and parse it into req.params. The
// body is bounded by --max-body-bytes here (413); multipart/form-data is
// refused (415); both through `error`. Then `handler` runs; whatever it
// throws becomes a 500 with the message.
using BodyHandler = std::function<void(ServeState&, const httplib::Request&, const std::string& body, httplib::Response&)>;
httplib::Server::HandlerWithContentReader withBody(ServeState& s, BodyHandler handler, ErrorReply error = replyError);

}  // namespace cohort::serve::detail
