#include "cohort/monitor/prometheus.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <mutex>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "core/detail/http_server.h"

namespace cohort::monitor {
namespace {

constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

bool isLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool isDigit(char c) { return c >= '0' && c <= '9'; }

bool isValidLabelName(const std::string& name) {
  if (name.empty() || !isLetter(name[0]) || name.rfind("__", 0) == 0) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return isLetter(c) || isDigit(c); });
}

std::string escapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string escapeHelp(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// Prometheus parses values with Go's ParseFloat: the shortest round-trip
// decimal (to_chars) reads back exactly; the special values have fixed names.
std::string formatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

bool isValidMetricName(const std::string& name) {
  if (name.empty() || !(isLetter(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return isLetter(c) || isDigit(c) || c == ':'; });
}

PrometheusText& PrometheusText::gauge(const std::string& name, const std::string& help,
                                      double value, const Labels& labels) {
  add("gauge", name, help, value, labels);
  return *this;
}

PrometheusText& PrometheusText::counter(const std::string& name, const std::string& help,
                                        double value, const Labels& labels) {
  if (value < 0) {
    throw ConfigError(fmt::format("Prometheus counter {}: value {} is negative (counters only grow)",
                                  name, value));
  }
  add("counter", name, help, value, labels);
  return *this;
}

PrometheusText& PrometheusText::histogram(const std::string& name, const std::string& help,
                                          const std::vector<double>& bounds,
                                          const std::vector<double>& counts, double sum,
                                          double count, const Labels& labels) {
  if (bounds.size() != counts.size()) {
    throw ConfigError(fmt::format("Prometheus histogram {}: {} bounds but {} counts", name,
                                  bounds.size(), counts.size()));
  }
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > (i + 1 < counts.size() ? counts[i + 1] : count) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      throw ConfigError(fmt::format(
          "Prometheus histogram {}: bucket counts must be cumulative and bounds increasing", name));
    }
  }
  for (size_t i = 0; i <= bounds.size(); ++i) {
    Labels withLe = labels;
    withLe.emplace_back("le", i < bounds.size() ? formatValue(bounds[i]) : "+Inf");
    add("histogram", name, help, i < bounds.size() ? counts[i] : count, withLe, name + "_bucket");
  }
  add("histogram", name, help, sum, labels, name + "_sum");
  add("histogram", name, help, count, labels, name + "_count");
  return *this;
}

void PrometheusText::add(const std::string& type, const std::string& name, const std::string& help,
                         double value, const Labels& labels, const std::string& sampleName) {
  if (!isValidMetricName(name)) {
    throw ConfigError(fmt::format(
        "Prometheus metric name '{}' is invalid: it must match [a-zA-Z_:][a-zA-Z0-9_:]*", name));
  }
  std::string line = sampleName.empty() ? name : sampleName;
  if (!labels.empty()) {
    line += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      const auto& [key, val] = labels[i];
      if (!isValidLabelName(key)) {
        throw ConfigError(fmt::format(
            "Prometheus metric {}: label name '{}' is invalid: it must match "
            "[a-zA-Z_][a-zA-Z0-9_]* and not start with '__'",
            name, key));
      }
      for (size_t k = 0; k < i; ++k) {
        if (labels[k].first == key) {
          throw ConfigError(fmt::format("Prometheus metric {}: label '{}' given twice", name, key));
        }
      }
      if (i > 0) line += ',';
      line += key + "=\"" + escapeLabelValue(val) + '"';
    }
    line += '}';
  }
  line += ' ' + formatValue(value);

  auto it = std::find_if(families_.begin(), families_.end(),
                         [&](const Family& f) { return f.name == name; });
  if (it == families_.end()) {
    families_.push_back({name, help, type, {}});
    it = families_.end() - 1;
  } else if (it->type != type || it->help != help) {
    throw ConfigError(fmt::format(
        "Prometheus metric {}: added as a {} with help '{}', then as a {} with help '{}'", name,
        it->type, it->help, type, help));
  }
  it->samples.push_back(std::move(line));
}

std::string PrometheusText::str() const {
  std::string out;
  for (const Family& f : families_) {
    out += "# HELP " + f.name + ' ' + escapeHelp(f.help) + '\n';
    out += "# TYPE " + f.name + ' ' + f.type + '\n';
    for (const auto& s : f.samples) out += s + '\n';
  }
  return out;
}

void MetricsServerConfig::validate() const {
  if (host.empty()) throw ConfigError("metrics endpoint: the host is empty");
  if (port < 0 || port > 65535) {
    throw ConfigError(fmt::format("metrics endpoint: port {} is outside [0, 65535]", port));
  }
  http::requireTokenBeyondLoopback(
      "metrics endpoint", host, token,
      "set output.metrics_token_file (Prometheus sends it with authorization.credentials_file)");
  if (tlsCert.empty() != tlsKey.empty()) {
    throw ConfigError("metrics endpoint: https needs both output.metrics_tls_cert and metrics_tls_key");
  }
}

struct MetricsServer::Impl {
  MetricsServerConfig config;
  Render render;
  std::mutex renderMutex;  // render never runs concurrently with itself
  std::unique_ptr<httplib::Server> owned;  // Server, or SSLServer for https
  std::unique_ptr<http::Listener> listener;
  std::atomic<int> port{0};
  bool started = false;
};

MetricsServer::MetricsServer(MetricsServerConfig config, Render render)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  impl_->render = std::move(render);
}

MetricsServer::~MetricsServer() { stop(); }

int MetricsServer::port() const { return impl_->port.load(); }

std::string MetricsServer::address() const {
  return http::bracketed(impl_->config.host) + ":" +
         std::to_string(impl_->port.load() != 0 ? impl_->port.load() : impl_->config.port);
}

void MetricsServer::start() {
  Impl& s = *impl_;
  if (s.started) throw Error("metrics endpoint " + address() + ": started twice");
  s.config.validate();
  s.started = true;
  if (s.config.tlsCert.empty()) {
    s.owned = std::make_unique<httplib::Server>();
  } else {
    auto tls = std::make_unique<httplib::SSLServer>(s.config.tlsCert.c_str(), s.config.tlsKey.c_str());
    if (!tls->is_valid()) {
      throw ConfigError(fmt::format(
          "metrics endpoint: cannot use the certificate {} with the key {} (unreadable, not PEM, "
          "or not a pair)",
          s.config.tlsCert, s.config.tlsKey));
    }
    s.owned = std::move(tls);
  }
  if (!s.config.token.empty()) {
    // Checked before routing, in constant time, for every path.
    s.owned->set_pre_routing_handler([&s](const httplib::Request& req, httplib::Response& res) {
      if (http::bearerMatches(req, s.config.token)) return httplib::Server::HandlerResponse::Unhandled;
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content("missing or wrong bearer token\n", "text/plain; charset=utf-8");
      return httplib::Server::HandlerResponse::Handled;
    });
  }

  s.owned->Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    std::string body;
    try {
      std::lock_guard<std::mutex> g(s.renderMutex);
      body = s.render();
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(std::string("cannot render the metrics: ") + e.what() + "\n",
                      "text/plain; charset=utf-8");
      return;
    }
    res.set_content(body, kContentType);
  });
  s.owned->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404) {
      res.set_content("not found: " + req.path + " (metrics are at /metrics)\n",
                      "text/plain; charset=utf-8");
    }
  });
  // Two workers: a scraper's idle keep-alive connection does not hold up a
  // second client. Short timeouts bound how long stop() waits for them.
  s.owned->new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.owned->set_keep_alive_timeout(1);
  s.owned->set_read_timeout(1, 0);
  s.owned->set_write_timeout(2, 0);
  s.port = http::bindHardened(*s.owned, "metrics endpoint", s.config.host, s.config.port);
  s.listener = std::make_unique<http::Listener>(*s.owned);
  // The socket listens already (connections queue in the backlog); wait for
  // the accept loop so that stop() can end it.
  if (!s.listener->waitRunning(std::chrono::seconds(10))) {
    stop();
    throw CommError(fmt::format("metrics endpoint {}: the server did not start", address()));
  }
}

void MetricsServer::stop() {
  if (impl_->listener) impl_->listener->stop();
}

}  // namespace cohort::monitor
