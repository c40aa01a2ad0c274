#include "serve/detail/serve_metrics.h"

#include <algorithm>

#include "cohort/monitor/prometheus.h"

namespace cohort::serve::detail {

namespace {

const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,   30};
const std::vector<double> kBatchBounds = {1, 2, 4, 8, 16, 32, 64, 128, 256};

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard<std::mutex> g(mutex_);
  ++counts_[i];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard<std::mutex> g(mutex_);
  Snapshot s;
  s.bounds = bounds_;
  double running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    running += static_cast<double>(counts_[i]);
    s.cumulative.push_back(running);
  }
  s.count = running + static_cast<double>(counts_.back());
  s.sum = sum_;
  return s;
}

ServeMetrics::ServeMetrics()
    : batchSize_(kBatchBounds), batchSeconds_(kLatencyBounds), firstToken_(kLatencyBounds),
      betweenTokens_(kLatencyBounds) {}

void ServeMetrics::firstToken(double seconds) { firstToken_.observe(seconds); }

void ServeMetrics::betweenTokens(double seconds) { betweenTokens_.observe(seconds); }

void ServeMetrics::request(const std::string& endpoint, int status, std::optional<double> seconds) {
  std::lock_guard<std::mutex> g(mutex_);
  ++requests_[{endpoint, status}];
  if (seconds) latency_.try_emplace(endpoint, kLatencyBounds).first->second.observe(*seconds);
}

void ServeMetrics::batch(int64_t size, double seconds) {
  batchSize_.observe(static_cast<double>(size));
  batchSeconds_.observe(seconds);
}

std::string ServeMetrics::render() const {
  monitor::PrometheusText t;
  {
    std::lock_guard<std::mutex> g(mutex_);
    for (const auto& [key, n] : requests_) {
      t.counter("cohort_serve_requests_total", "HTTP requests answered, by endpoint and status code",
                static_cast<double>(n), {{"endpoint", key.first}, {"code", std::to_string(key.second)}});
    }
    for (const auto& [endpoint, h] : latency_) {
      const auto s = h.snapshot();
      t.histogram("cohort_serve_request_duration_seconds",
                  "Time from a request's headers to its answer, by endpoint", s.bounds, s.cumulative,
                  s.sum, s.count, {{"endpoint", endpoint}});
    }
  }
  const auto size = batchSize_.snapshot();
  t.histogram("cohort_serve_batch_size", "Inputs per forward of the model", size.bounds,
              size.cumulative, size.sum, size.count);
  const auto secs = batchSeconds_.snapshot();
  t.histogram("cohort_serve_batch_duration_seconds", "Time of one forward of the model", secs.bounds,
              secs.cumulative, secs.sum, secs.count);
  t.counter("cohort_serve_batches_at_once_total",
            "Forwards run without waiting for their batch to fill: every request in flight was queued",
            static_cast<double>(batchesAtOnce_.load()));
  t.gauge("cohort_serve_queue_depth", "Inputs waiting for the model",
          static_cast<double>(queueDepth.load()));
  t.gauge("cohort_serve_in_flight", "Requests being answered", static_cast<double>(inFlight.load()));
  if (generation.load()) {
    const auto first = firstToken_.snapshot();
    t.histogram("cohort_serve_time_to_first_token_seconds",
                "Time from a generation's arrival to its first token", first.bounds, first.cumulative, first.sum,
                first.count);
    const auto between = betweenTokens_.snapshot();
    t.histogram("cohort_serve_time_between_tokens_seconds", "Time from one token of a generation to its next",
                between.bounds, between.cumulative, between.sum, between.count);
    t.counter("cohort_serve_generated_tokens_total", "Tokens generated (rate(): tokens per second)",
              static_cast<double>(generatedTokens.load()));
    t.counter("cohort_serve_prompt_tokens_total", "Prompt tokens of the generations admitted",
              static_cast<double>(promptTokens.load()));
    t.gauge("cohort_serve_requests_waiting", "Generations waiting to join the running batch",
            static_cast<double>(requestsWaiting.load()));
    t.gauge("cohort_serve_requests_running", "Generations in the running batch",
            static_cast<double>(requestsRunning.load()));
    t.gauge("cohort_serve_kv_cache_blocks_in_use", "Key/value cache blocks held by running generations",
            static_cast<double>(kvBlocksInUse.load()));
    t.gauge("cohort_serve_kv_cache_blocks", "Key/value cache blocks the pool's memory has room for",
            static_cast<double>(kvBlocksTotal.load()));
    t.gauge("cohort_serve_kv_cache_block_bytes", "Bytes of one key/value cache block over all layers",
            static_cast<double>(kvBlockBytes.load()));
  }
  return t.str();
}

std::string endpointLabel(const std::string& path) {
  for (const char* known : {"/v1/predict", "/v1/generate", "/v1/model", "/v1/completions", "/v1/chat/completions",
                            "/v1/models", "/healthz", "/readyz", "/metrics"}) {
    if (path == known) return path;
  }
  return "other";
}

}  // namespace cohort::serve::detail
