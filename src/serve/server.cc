// `cohort serve`: options, the listening socket, authentication, the
// request log into the metrics, and the shutdown on SIGTERM/SIGINT. The
// routes are handlers.cc's, the batching batcher.cc's (inputs) and
// scheduler.cc's (generations of a model that decodes).

#include "cohort/serve/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <optional>
#include <thread>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/signals.h"
#include "cohort/security/keys.h"
#include "cohort/serve/model.h"
#include "core/detail/http_server.h"
#include "serve/detail/batcher.h"
#include "serve/detail/handlers.h"
#include "serve/detail/openai.h"
#include "serve/detail/request.h"
#include "serve/detail/scheduler.h"
#include "serve/detail/serve_metrics.h"
#include "serve/detail/split.h"

namespace cohort::serve {

namespace {

void validate(const ServeOptions& o) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw UsageError("cohort serve: " + what);
  };
  require(!o.host.empty(), "--host is empty");
  require(o.port >= 0 && o.port <= 65535, fmt::format("--port {} is outside [0, 65535]", o.port));
  require(o.maxBatch >= 1, fmt::format("--max-batch must be >= 1, got {}", o.maxBatch));
  require(o.maxDelayMs >= 0 && o.maxDelayMs <= 600'000,
          fmt::format("--max-delay-ms must be in [0, 600000], got {}", o.maxDelayMs));
  require(o.threads >= 1 && o.threads <= 1024, fmt::format("--threads must be in [1, 1024], got {}", o.threads));
  require(o.maxBodyBytes >= 1, fmt::format("--max-body-bytes must be >= 1, got {}", o.maxBodyBytes));
  require(o.maxConcurrency >= 1, fmt::format("--max-concurrency must be >= 1, got {}", o.maxConcurrency));
  require(o.maxQueue >= 1, fmt::format("--max-queue must be >= 1, got {}", o.maxQueue));
  require(o.topK >= 1, fmt::format("--top-k must be >= 1, got {}", o.topK));
  require(o.maxNewTokens >= 0, fmt::format("--max-new-tokens must be >= 0, got {}", o.maxNewTokens));
  require(o.drainSeconds >= 0 && o.drainSeconds <= 86400,
          fmt::format("--drain-seconds must be in [0, 86400], got {}", o.drainSeconds));
  require(o.computeThreads >= 0, fmt::format("--compute-threads must be >= 0, got {}", o.computeThreads));
  require(o.procs >= 1, fmt::format("--procs {}: must be >= 1", o.procs));
  require(!o.tensor || o.procs >= 2, fmt::format("--tensor: needs --procs 2 or more, got {}", o.procs));
  require(o.maxStepTokens >= 0, fmt::format("--max-step-tokens must be >= 0, got {}", o.maxStepTokens));
  require(o.kvBlockTokens >= 1 && o.kvBlockTokens <= 65536,
          fmt::format("--kv-block-tokens must be in [1, 65536], got {}", o.kvBlockTokens));
}

// The bearer token: --token-file (owner-only), else $COHORT_SERVE_TOKEN.
std::string bearerToken(const ServeOptions& o) {
  std::string token = o.tokenFile.empty() ? env::serveToken().value_or("")
                                          : security::readSecretFile(o.tokenFile, "--token-file");
  http::requireTokenBeyondLoopback("cohort serve", o.host, token,
                                   fmt::format("--token-file FILE (mode 0600) or ${}", env::kServeTokenVar));
  return token;
}

// When this worker thread took the request it is answering: set before
// routing, read and reset by the logger, which runs on the same thread after
// the answer is written. A request httplib answers before routing (a
// malformed request line, a 413 on Content-Length) never sets it: the logger
// sees the reset value and records no latency rather than a stale one.
thread_local std::optional<std::chrono::steady_clock::time_point> requestStart;

void configure(httplib::Server& server, detail::ServeState& state, const std::string& token) {
  server.set_pre_routing_handler([&token](const httplib::Request& req, httplib::Response& res) {
    requestStart = std::chrono::steady_clock::now();
    if (token.empty() || req.path == "/healthz" || req.path == "/readyz" || http::bearerMatches(req, token)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.set_header("WWW-Authenticate", "Bearer");
    const std::string message = "missing or wrong bearer token (Authorization: Bearer ...)";
    if (detail::isOpenAIPath(req.path)) {
      // The OpenAI API's key is the bearer token: refused in OpenAI's shape.
      detail::replyOpenAIError(res, 401, "Incorrect API key provided: " + message);
    } else {
      res.status = 401;
      res.set_content(detail::errorBody(message), "application/json");
    }
    return httplib::Server::HandlerResponse::Handled;
  });
  // Counted before the response is written (httplib's post-routing
  // handler), not after (its logger): a client that scrapes /metrics once
  // it has its answer finds that answer counted.
  server.set_post_routing_handler([&state](const httplib::Request& req, httplib::Response& res) {
    std::optional<double> seconds;
    if (requestStart) {
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - *requestStart).count();
    }
    requestStart.reset();
    state.metrics.request(detail::endpointLabel(req.path), res.status, seconds);
  });
  // Errors httplib answers itself (404, 405, 413, a malformed request line)
  // get a JSON body like the handlers'.
  server.set_error_handler([&state](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = fmt::format("HTTP {}", res.status);
    if (res.status == 404) message = "no such endpoint: " + req.path;
    if (res.status == 413) {
      message = fmt::format("the body is larger than {} bytes (--max-body-bytes)", state.options.maxBodyBytes);
    }
    res.set_content(detail::errorBody(message), "application/json");
  });
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(detail::errorBody(message), "application/json");
  });
  server.set_payload_max_length(static_cast<size_t>(state.options.maxBodyBytes));
  const int threads = state.options.threads;
  server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  // Idle keep-alive connections hold a worker: short timeouts bound that,
  // and how long the shutdown waits for them.
  server.set_keep_alive_timeout(2);
  // A response goes out in more than one write (headers, body): with Nagle's
  // algorithm the last waits for the client's delayed ACK, ~40 ms a request.
  server.set_tcp_nodelay(true);
  server.set_read_timeout(10, 0);
  server.set_write_timeout(10, 0);
  detail::addRoutes(server, state);
}

}  // namespace

int serveCommand(const ServeOptions& o) {
  if (o.splitRank >= 0) return detail::runSplitRank(o);
  validate(o);
  const std::string token = bearerToken(o);
  // Before any thread starts, so that every thread inherits the mask and
  // the signals are taken here, between polls.
  BlockedSignals signals({SIGTERM, SIGINT});
  if (o.computeThreads > 0) at::set_num_threads(o.computeThreads);

  std::unique_ptr<Predictor> predictor;
  if (o.procs > 1) {
    SplitOptions so;
    so.procs = o.procs;
    so.tensor = o.tensor;
    so.computeThreads = o.computeThreads;
    predictor = openSplitPredictor(o.model, o.job, so);
  } else {
    predictor = openPredictor(o.model, o.job);
  }
  const ModelInfo& info = predictor->info();
  detail::ServeMetrics metrics;
  detail::BatcherOptions bo;
  bo.maxBatch = o.maxBatch;
  bo.maxDelay = std::chrono::microseconds(static_cast<int64_t>(o.maxDelayMs * 1000));
  bo.maxQueue = o.maxQueue;
  bo.computeThreads = o.computeThreads;
  bo.waitAlone = o.waitAlone;
  detail::Batcher batcher(*predictor, bo, metrics);
  // A model that decodes: generations are batched token by token by the
  // scheduler (continuous batching, a paged key/value cache).
  std::unique_ptr<detail::Scheduler> scheduler;
  if (predictor->decodes()) {
    detail::SchedulerOptions so;
    so.maxRows = o.maxBatch;
    so.maxDelay = bo.maxDelay;
    so.maxWaiting = o.maxQueue;
    so.stepTokens = o.maxStepTokens;
    so.blockTokens = o.kvBlockTokens;
    so.blockSize = info.blockSize;
    so.vocab = info.tokenizerVocab > 0 ? std::min(info.tokenizerVocab, info.vocabSize) : info.vocabSize;
    so.computeThreads = o.computeThreads;
    scheduler = std::make_unique<detail::Scheduler>(*predictor, so, metrics);
  }
  detail::ServeState state{o, info, batcher, metrics, predictor->decodes(), scheduler.get()};

  httplib::Server server;
  configure(server, state, token);
  const int port = http::bindHardened(server, "cohort serve", o.host, o.port);
  // Whatever way serveCommand leaves, the listener stops and joins.
  http::Listener listener(server);
  // The port file says "accepting": wait for the accept loop (bounded).
  if (!listener.waitRunning(std::chrono::seconds(10))) {
    throw CommError(fmt::format("cohort serve: the accept loop on {}:{} did not start", http::bracketed(o.host), port));
  }
  if (!o.portFile.empty()) {
    try {
      writeFileAtomic(o.portFile, std::to_string(port) + "\n");
    } catch (const Error& e) {
      throw UsageError(fmt::format("cohort serve: --port-file {}: cannot write it: {}", o.portFile, e.what()));
    }
  }
  const std::string what = info.tokens ? fmt::format("{}, block {}", info.arch, info.blockSize)
                                       : fmt::format("{}, {}x{}x{}, {} classes", info.arch, info.channels,
                                                     info.height, info.width, info.numClasses);
  const std::string batching =
      scheduler != nullptr
          ? fmt::format("continuous batching of up to {} generations, {} tokens a step beyond one each, "
                        "key/value cache blocks of {} positions",
                        o.maxBatch, o.maxStepTokens, o.kvBlockTokens)
          : fmt::format("batches of up to {} within {} ms", o.maxBatch, o.maxDelayMs);
  log::info("serve: {} ({}) at http://{}:{}; {}; {} HTTP threads{}", o.model, what, http::bracketed(o.host), port,
            batching, o.threads, token.empty() ? "" : "; bearer token required");
  std::cout << "listening on http://" << http::bracketed(o.host) << ":" << port << std::endl;

  int sig = 0;
  std::string broken;  // a split model's rank ended: the server stops, and fails
  while (sig == 0 && broken.empty()) {
    sig = signals.wait(std::chrono::milliseconds(200));
    broken = predictor->broken();
  }
  // Draining: new work gets 503 (the socket stays open so that clients learn
  // it) and in-flight requests are answered, their batches run without
  // waiting to fill, for at most --drain-seconds; what still waits for the
  // model then gets 503; then the socket closes.
  log::info("serve: {}: draining {} requests in flight", sig != 0 ? strsignal(sig) : broken.c_str(),
            metrics.inFlight.load());
  state.draining = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.drainSeconds);
  // Nothing new will fill a batch: run what waits at once (with no time to
  // drain, --drain-seconds 0, what waits is answered 503 below instead).
  if (std::chrono::steady_clock::now() < deadline) {
    batcher.drain();
    if (scheduler != nullptr) scheduler->drain();
  }
  while (metrics.inFlight.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (metrics.inFlight.load() > 0) {
    log::warn("serve: {} requests still in flight after {} s (--drain-seconds); stopping anyway",
              metrics.inFlight.load(), o.drainSeconds);
  }
  // Requests waiting for the model answer 503 (streams end with an error
  // line) at their next check instead of holding the workers the listener's
  // join waits for.
  state.stopping = true;
  listener.stop();
  if (!broken.empty()) {
    log::error("serve: stopped: {}", broken);
    return 1;
  }
  log::info("serve: stopped");
  return 0;
}

}  // namespace cohort::serve
