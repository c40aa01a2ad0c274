#pragma once

// The routes of `cohort serve` (docs/deploy.md, "Serving"): /v1/predict,
// /v1/generate, /v1/model, /healthz, /readyz, /metrics. Compiled with
// cpp-httplib's options (src/CMakeLists.txt, COHORT_HTTPLIB_SOURCES).

#include <httplib.h>

#include <atomic>

#include "cohort/serve/model.h"
#include "cohort/serve/server.h"
#include "serve/detail/batcher.h"
#include "serve/detail/serve_metrics.h"

namespace cohort::serve::detail {

// What the handlers share; owned by serveCommand, outlives the server.
struct ServeState {
  const ServeOptions& options;
  const ModelInfo& info;  // the predictor's; its forward is the batcher's alone
  Batcher& batcher;
  ServeMetrics& metrics;
  std::atomic<bool> draining{false};  // SIGTERM seen: new work gets 503
  int listenSocket = -1;  // the bound socket (server.cc raises its backlog)
};

// Registers the routes on `server`. Every handler answers errors as JSON
// {"error": ...}: 400 for a body it cannot use, 429 above max concurrency,
// 503 when the queue is full or the server drains, 500 for a failed forward.
void addRoutes(httplib::Server& server, ServeState& state);

}  // namespace cohort::serve::detail
