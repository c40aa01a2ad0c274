#include "cohort/monitor/prometheus.h"

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/crypto.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/net.h"

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

std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
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
  if (token.empty() && !isLoopbackAddress(host)) {
    throw ConfigError(fmt::format(
        "metrics endpoint: listening on {} (beyond this machine's loopback) needs a token: set "
        "output.metrics_token_file (Prometheus sends it with authorization.credentials_file)",
        host));
  }
  if (tlsCert.empty() != tlsKey.empty()) {
    throw ConfigError("metrics endpoint: https needs both output.metrics_tls_cert and metrics_tls_key");
  }
}

struct MetricsServer::Impl {
  MetricsServerConfig config;
  Render render;
  std::mutex renderMutex;  // render never runs concurrently with itself
  std::unique_ptr<httplib::Server> owned;  // Server, or SSLServer for https
  std::thread thread;
  std::atomic<int> port{0};
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;  // the server thread returned from listen_after_bind
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
  return bracketed(impl_->config.host) + ":" +
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
      const std::string expected = "Bearer " + s.config.token;
      const std::string given = req.get_header_value("Authorization");
      if (given.size() == expected.size() &&
          CRYPTO_memcmp(given.data(), expected.data(), given.size()) == 0) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
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
  // cpp-httplib sets SO_REUSEPORT by default, which lets a second server bind
  // a port in use and take half its scrapes; SO_REUSEADDR alone only allows
  // rebinding over connections in TIME_WAIT.
  s.owned->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });

  int bound = -1;
  if (s.config.port == 0) {
    bound = s.owned->bind_to_any_port(s.config.host);
  } else if (s.owned->bind_to_port(s.config.host, s.config.port)) {
    bound = s.config.port;
  }
  if (bound <= 0) {
    throw CommError(fmt::format(
        "metrics endpoint: cannot listen on {}:{}: the port is in use, or the address is not "
        "one of this machine's",
        bracketed(s.config.host), s.config.port));
  }
  s.port = bound;
  s.thread = std::thread([&s] {
    s.owned->listen_after_bind();
    std::lock_guard<std::mutex> g(s.mutex);
    s.finished = true;
    s.cv.notify_all();
  });
  // The socket listens already (connections queue in the backlog); wait for
  // the accept loop so that stop() can end it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::unique_lock<std::mutex> lock(s.mutex);
  while (!s.finished && !s.owned->is_running() && std::chrono::steady_clock::now() < deadline) {
    s.cv.wait_for(lock, std::chrono::milliseconds(1));
  }
  if (s.finished || !s.owned->is_running()) {
    lock.unlock();
    stop();
    throw CommError(fmt::format("metrics endpoint {}: the server did not start", address()));
  }
}

void MetricsServer::stop() {
  Impl& s = *impl_;
  if (!s.thread.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    // stop() closes the listening socket; called once, while the accept loop
    // runs (start() waited for it).
    if (!s.finished) s.owned->stop();
    if (!s.cv.wait_for(lock, std::chrono::seconds(10), [&s] { return s.finished; })) {
      log::warn("metrics endpoint {}: the server thread is still busy after 10 s; waiting for it",
                address());
    }
  }
  s.thread.join();
}

}  // namespace cohort::monitor
