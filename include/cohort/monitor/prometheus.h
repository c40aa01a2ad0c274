#pragma once

// Prometheus metrics: the text exposition format (version 0.0.4) and an HTTP
// endpoint serving it at GET /metrics. See docs/monitoring.md.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cohort::monitor {

// Builds one exposition: families in the order they first appear, each as
//
//   # HELP <name> <help>
//   # TYPE <name> gauge|counter|histogram
//   <name>{<label>="<value>",...} <number>
//
// with every sample of a family together, whatever order they were added in.
// Label values escape backslash, double quote and newline (\\, \", \n); help
// text escapes backslash and newline. Numbers print as the shortest decimal
// that reads back to the same double; NaN, +Inf and -Inf as Prometheus spells
// them.
//
// Throws ConfigError naming the metric when a name does not match
// [a-zA-Z_:][a-zA-Z0-9_:]*, a label name does not match [a-zA-Z_][a-zA-Z0-9_]*
// (or starts with the reserved "__", or repeats in one sample), a family is
// added again with another type or help, or a counter is negative. Counters
// should be named `..._total` (promtool's lint asks for it). Not thread-safe:
// build one per scrape.
class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  PrometheusText& gauge(const std::string& name, const std::string& help, double value,
                        const Labels& labels = {});
  PrometheusText& counter(const std::string& name, const std::string& help, double value,
                          const Labels& labels = {});
  // A histogram: `counts[i]` observations at most `bounds[i]` (cumulative,
  // bounds increasing), rendered as <name>_bucket{le="..."} for each bound
  // and +Inf (`count`), then <name>_sum and <name>_count. Throws ConfigError
  // when the sizes differ or the counts are not cumulative.
  PrometheusText& histogram(const std::string& name, const std::string& help,
                            const std::vector<double>& bounds, const std::vector<double>& counts,
                            double sum, double count, const Labels& labels = {});

  // The exposition, ending with a newline (empty when nothing was added).
  std::string str() const;

 private:
  struct Family {
    std::string name, help, type;
    std::vector<std::string> samples;  // rendered lines, without the newline
  };
  void add(const std::string& type, const std::string& name, const std::string& help, double value,
           const Labels& labels, const std::string& sampleName = "");
  std::vector<Family> families_;
};

// True when `name` is a valid metric name.
bool isValidMetricName(const std::string& name);

struct MetricsServerConfig {
  MetricsServerConfig() = default;
  MetricsServerConfig(std::string host, int port) : host(std::move(host)), port(port) {}

  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 0;                    // 0: a free port chosen by the system
  // Every request must carry `Authorization: Bearer <token>` (else 401);
  // empty: none, which only a loopback host may have.
  std::string token;
  // PEM files: serve https instead of http (both or neither).
  std::string tlsCert, tlsKey;
  // Throws ConfigError for an empty host, a port outside [0, 65535], a host
  // beyond loopback without a token, or only one of tlsCert and tlsKey.
  void validate() const;
};

// Serves the text `render` returns at GET /metrics (Content-Type
// "text/plain; version=0.0.4; charset=utf-8"); every other path is 404.
// cpp-httplib on a background thread with two workers.
//
// `render` runs on a server thread, never concurrently with itself, so it
// must only be safe against the caller's own threads (read atomics, or take
// a lock). If it throws, that scrape gets a 500 with the message; the server
// goes on.
//
//   MetricsServer s({"127.0.0.1", 0}, [&] { return PrometheusText().gauge(...).str(); });
//   s.start();          // bound and accepting when it returns
//   s.port();           // the port it got
//   s.stop();           // or the destructor
class MetricsServer {
 public:
  using Render = std::function<std::string()>;

  MetricsServer(MetricsServerConfig config, Render render);
  // Stops and joins the server thread (see stop()).
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds host:port and starts serving; returns once the socket listens.
  // Throws ConfigError (bad config), CommError naming host:port when it
  // cannot bind (port in use, address not of this machine), or Error when
  // called twice.
  void start();

  // Closes the listening socket and joins the server thread. A scrape being
  // answered is finished first; idle keep-alive connections and clients that
  // send nothing are dropped within ~1 s (the server's read and keep-alive
  // timeouts), so stop() returns within about 2 s. Idempotent; no-op before
  // start().
  void stop();

  // The bound port (after start()); 0 before.
  int port() const;
  // "host:port" (IPv6 hosts in brackets), for messages and scrape configs.
  std::string address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::monitor
