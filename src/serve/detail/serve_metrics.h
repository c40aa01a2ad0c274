#pragma once

// The counters of `cohort serve`, rendered at GET /metrics (docs/deploy.md,
// "Metrics"). Every method is thread-safe: HTTP workers and the model thread
// record, a scrape renders.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cohort::serve::detail {

// Observations in fixed buckets (cumulative when rendered).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  struct Snapshot {
    std::vector<double> bounds, cumulative;
    double sum = 0, count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
};

class ServeMetrics {
 public:
  ServeMetrics();

  // One answered request: `endpoint` is a known path or "other". Without
  // `seconds` (a request httplib refused before routing, whose start is
  // unknown) it is counted but not in the latency histogram.
  void request(const std::string& endpoint, int status, std::optional<double> seconds);
  // One forward of `size` inputs.
  void batch(int64_t size, double seconds);
  // A forward that did not wait for its batch to fill: every request in
  // flight was queued (serve/detail/batcher.h).
  void batchAtOnce() { batchesAtOnce_.fetch_add(1); }

  std::atomic<int64_t> inFlight{0};    // requests being answered (admitted ones)
  std::atomic<int64_t> queueDepth{0};  // inputs waiting for the model

  // Generation with continuous batching (scheduler.h), rendered once
  // `generation` is set: a token's latency from the request's arrival
  // (the first) or from the token before, and the scheduler's state.
  void firstToken(double seconds);
  void betweenTokens(double seconds);
  std::atomic<bool> generation{false};
  std::atomic<int64_t> generatedTokens{0};  // counters
  std::atomic<int64_t> promptTokens{0};
  std::atomic<int64_t> requestsWaiting{0};  // gauges
  std::atomic<int64_t> requestsRunning{0};
  std::atomic<int64_t> kvBlocksInUse{0};
  std::atomic<int64_t> kvBlocksTotal{0};
  std::atomic<int64_t> kvBlockBytes{0};

  // The Prometheus text exposition.
  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, Histogram> latency_;
  Histogram batchSize_;
  Histogram batchSeconds_;
  std::atomic<uint64_t> batchesAtOnce_{0};
  Histogram firstToken_;
  Histogram betweenTokens_;
};

// The label of a request path: one of the server's routes, else "other" (so
// that scanning clients cannot grow the label set).
std::string endpointLabel(const std::string& path);

}  // namespace cohort::serve::detail
