// Rendezvous on etcd through its v3 JSON API (the gRPC gateway every etcd
// 3.4 member serves on its client port): keys and values travel base64
// encoded, 64-bit numbers as JSON strings. Operations used: /v3/kv/range,
// /v3/kv/put, /v3/kv/txn (compare-and-set on a key's mod_revision),
// /v3/lease/grant|keepalive|revoke (liveness) and /v3/watch (waiting for a
// change, read as a stream until its first event).
//
// Several endpoints (the members of a cluster) are tried in turn: a request
// that fails with a transient error (no connection, a member without a
// leader, an overloaded member) moves to the next one, with backoff, for at
// most KvOptions::retryFor. Each attempt gives up after a quarter of a
// lease's life, and a member that did not answer at all is avoided for a
// lease's life: a partitioned member (which refuses nothing, it is silent)
// would otherwise cost every request, lease renewals among them, its
// timeout.
//
// etcds://: the same over https, with the CA, client certificate and key of
// KvOptions; with an etcd user, every request carries the token
// /v3/auth/authenticate gave (asked again when etcd says it is no longer
// valid).

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/core/base64.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "core/detail/http.h"
#include "core/detail/json_int.h"
#include "elastic/detail/kv_backends.h"

namespace cohort::elastic::detail {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// etcd's JSON API writes 64-bit numbers as strings; absent means 0.
int64_t int64Of(const json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key)) return 0;
  const json& v = obj.at(key);
  if (v.is_string()) {
    try {
      return std::stoll(v.get<std::string>());
    } catch (const std::exception&) {
      throw CommError(fmt::format("etcd: {} is not a number: {}", key, v.dump()));
    }
  }
  return jsonInt<int64_t>(v);
}

// An HTTP status etcd answers while it cannot serve for now.
bool transientStatus(int status) { return status == 429 || status == 500 || status == 502 || status == 503 || status == 504; }

// The gateway reports an unavailable cluster as an error body too.
bool transientBody(const std::string& body) {
  return body.find("no leader") != std::string::npos ||
         body.find("leader changed") != std::string::npos ||
         body.find("timed out") != std::string::npos ||
         body.find("too many requests") != std::string::npos ||
         body.find("Unavailable") != std::string::npos;
}

struct Retry {};  // thrown inside an attempt: try the next endpoint
// Thrown inside an attempt: etcd did not authenticate the user.
struct AuthRefused {
  int status;
  std::string body;
};

// The answer of a member that refused this client's credentials: no retry
// helps (a TLS alert, an unknown user, a wrong password).
bool refusedCredentials(const std::string& text) {
  return text.find("alert") != std::string::npos || text.find("certificate") != std::string::npos ||
         text.find("authentication failed") != std::string::npos ||
         text.find("permission denied") != std::string::npos ||
         text.find("user name is empty") != std::string::npos;
}

// An expired token, or one older than a change to etcd's users and roles:
// authenticate again.
bool staleToken(const std::string& body) {
  return body.find("invalid auth token") != std::string::npos ||
         body.find("auth token is expired") != std::string::npos ||
         body.find("revision of auth store is old") != std::string::npos;
}

class EtcdKv final : public Kv {
 public:
  EtcdKv(std::vector<std::string> endpoints, bool tls, const KvOptions& options)
      : endpoints_(std::move(endpoints)),
        scheme_(tls ? "https://" : "http://"),
        options_(options),
        http_(httpOptions()) {}

  ~EtcdKv() override {
    try {
      release();
    } catch (const std::exception& e) {
      log::debug("etcd: releasing the lease: {}", e.what());
    }
  }

  std::string describe() const override {
    return fmt::format("etcd at {}{}", fmt::join(endpoints_, ","), scheme_ == "https://" ? " (TLS)" : "");
  }

  std::optional<Versioned> get(const std::string& key) override {
    const json r = call("/v3/kv/range", {{"key", base64Encode(key)}}, "read " + key);
    if (!r.contains("kvs") || r["kvs"].empty()) return std::nullopt;
    const json& kv = r["kvs"][0];
    return Versioned{base64Decode(kv.value("value", "")), int64Of(kv, "mod_revision")};
  }

  bool compareAndSet(const std::string& key, int64_t version, const std::string& value) override {
    const std::string k = base64Encode(key);
    json compare = version == 0
                       ? json{{"target", "CREATE"}, {"key", k}, {"create_revision", "0"}, {"result", "EQUAL"}}
                       : json{{"target", "MOD"}, {"key", k}, {"mod_revision", std::to_string(version)},
                              {"result", "EQUAL"}};
    const json body = {{"compare", json::array({compare})},
                       {"success", json::array({{{"request_put", {{"key", k}, {"value", base64Encode(value)}}}}})}};
    const json r = call("/v3/kv/txn", body, "compare-and-set " + key);
    return r.value("succeeded", false);
  }

  void put(const std::string& key, const std::string& value) override {
    call("/v3/kv/put", {{"key", base64Encode(key)}, {"value", base64Encode(value)}}, "write " + key);
  }

  void keepAlive(const std::string& key, const std::string& value) override {
    release();  // a lease that lapsed (a cut link) is replaced
    const int64_t ttl = std::max<int64_t>(1, (options_.aliveTtl.count() + 999) / 1000);
    const json g = call("/v3/lease/grant", {{"TTL", std::to_string(ttl)}}, "grant a lease");
    const std::string id = std::to_string(int64Of(g, "ID"));
    call("/v3/kv/put", {{"key", base64Encode(key)}, {"value", base64Encode(value)}, {"lease", id}},
         "write " + key);
    {
      std::lock_guard<std::mutex> g2(mutex_);
      lease_ = id;
      stop_ = false;
    }
    renewer_ = std::thread([this, id] { renewLoop(id); });
  }

  void release() override {
    std::string id;
    {
      std::lock_guard<std::mutex> g(mutex_);
      id = lease_;
      lease_.clear();
      stop_ = true;
    }
    cv_.notify_all();
    if (renewer_.joinable()) renewer_.join();
    if (id.empty()) return;
    try {
      call("/v3/lease/revoke", {{"ID", id}}, "revoke the lease");
    } catch (const CommError& e) {
      // Lapsed already, or etcd is gone: either way the key is not kept.
      log::debug("etcd: {}", e.what());
    }
  }

  bool alive(const std::string& key) override { return get(key).has_value(); }

  bool waitChange(const std::string& key, int64_t since, std::chrono::milliseconds timeout) override {
    const json create = {{"create_request",
                          {{"key", base64Encode(key)}, {"start_revision", std::to_string(since + 1)}}}};
    const std::string body = create.dump();
    std::string buffer;
    bool changed = false;
    struct Seen {};
    http::HttpRequest req;
    req.method = "POST";
    req.body = &body;
    req.totalTimeoutS = std::max(0.05, timeout.count() / 1000.0);
    req.sink = [&](const char* data, size_t n) {
      buffer.append(data, n);
      // One JSON message per line; the first acknowledges the watch.
      for (size_t nl; (nl = buffer.find('\n')) != std::string::npos;) {
        const json m = json::parse(buffer.substr(0, nl), nullptr, false);
        buffer.erase(0, nl + 1);
        if (!m.is_object()) continue;
        const json& r = m.contains("result") ? m["result"] : m;
        if (r.contains("events") && !r["events"].empty()) changed = true;
        // A compacted start revision: the key may have changed; read it.
        if (r.contains("compact_revision") || r.value("canceled", false)) changed = true;
        if (changed) throw Seen{};
      }
    };
    bool answered = false;  // the member acknowledged the watch
    auto sink = req.sink;
    req.sink = [&, sink](const char* data, size_t n) {
      answered = true;
      sink(data, n);
    };
    const size_t e = endpointToUse();
    req.url = scheme_ + endpoints_[e] + "/v3/watch";
    if (const std::string token = currentToken(); !token.empty()) req.headers = {{"Authorization", token}};
    try {
      const http::HttpResponse resp = http_.perform(req);
      if (resp.status != 200) changed = true;  // let the caller read the key again
    } catch (const Seen&) {
      return true;
    } catch (const http::TransportError& err) {
      // A watch that saw no change times out too; one that never heard
      // from the member is a member not answering.
      if (err.kind() != http::TransportError::Kind::timeout || !answered) {
        endpointFailed(e);
        std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds(100)));
        return true;  // unknown: read again (with retries) rather than wait blind
      }
    }
    return changed;
  }

 private:
  // One attempt gives up well within a lease's life.
  double attemptTimeoutS() const {
    return std::clamp(std::min(options_.retryFor, options_.aliveTtl / 4).count() / 1000.0, 0.25, 10.0);
  }

  // The current member, or the next one not avoided (all avoided: the
  // current one).
  size_t endpointToUse() {
    const size_t n = endpoints_.size();
    const size_t e = endpoint_.load() % n;
    std::lock_guard<std::mutex> g(avoidMutex_);
    const auto now = Clock::now();
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (e + k) % n;
      if (avoidUntil_.size() <= i || avoidUntil_[i] <= now) {
        if (k > 0) endpoint_.store(i);
        return i;
      }
    }
    return e;
  }

  // Member `e` did not answer: avoided for a lease's life, and the next
  // one is used.
  void endpointFailed(size_t e) {
    {
      std::lock_guard<std::mutex> g(avoidMutex_);
      avoidUntil_.resize(endpoints_.size());
      avoidUntil_[e] = Clock::now() + std::max(std::chrono::milliseconds(1000), options_.aliveTtl);
    }
    size_t expected = e;
    endpoint_.compare_exchange_strong(expected, (e + 1) % endpoints_.size());
  }

  http::HttpOptions httpOptions() const {
    http::HttpOptions o;
    o.timeoutS = attemptTimeoutS();
    o.caFile = options_.etcdCaFile;
    o.certFile = options_.etcdCertFile;
    o.keyFile = options_.etcdKeyFile;
    return o;
  }

  std::string currentToken() {
    std::lock_guard<std::mutex> g(mutex_);
    return token_;
  }

  // etcd's own authentication: a token for etcdUser (empty without one).
  // One attempt at `host`; throws what call() handles.
  std::string token(const std::string& host) {
    if (options_.etcdUser.empty()) return "";
    if (std::string t = currentToken(); !t.empty()) return t;
    const std::string text = json{{"name", options_.etcdUser}, {"password", options_.etcdPassword}}.dump();
    http::HttpRequest req;
    req.method = "POST";
    req.url = scheme_ + host + "/v3/auth/authenticate";
    req.body = &text;
    req.headers = {{"Content-Type", "application/json"}};
    req.totalTimeoutS = attemptTimeoutS();
    const http::HttpResponse resp = http_.perform(req);
    const json r = json::parse(resp.body, nullptr, false);
    if (resp.status == 200 && r.is_object() && r.contains("token")) {
      std::lock_guard<std::mutex> g(mutex_);
      token_ = r["token"].get<std::string>();
      return token_;
    }
    throw AuthRefused{resp.status, resp.body};
  }

  // One request, retried on transient failures across the endpoints.
  json call(const std::string& path, const json& body, const std::string& what) {
    const std::string text = body.dump();
    const auto deadline = Clock::now() + options_.retryFor;
    auto backoff = std::chrono::milliseconds(50);
    std::string last;
    for (int attempt = 0;; ++attempt) {
      const size_t e = endpointToUse();
      const std::string& host = endpoints_[e];
      bool silent = false;  // the member did not answer at all
      try {
        http::HttpRequest req;
        req.method = "POST";
        req.url = scheme_ + host + path;
        req.body = &text;
        req.headers = {{"Content-Type", "application/json"}};
        req.totalTimeoutS = attemptTimeoutS();
        if (const std::string t = token(host); !t.empty()) req.headers.emplace_back("Authorization", t);
        const http::HttpResponse resp = http_.perform(req);
        if (resp.status == 200) {
          const json r = json::parse(resp.body, nullptr, false);
          if (!r.is_discarded()) return r;
          last = fmt::format("{}: unreadable answer", host);
          throw Retry{};
        }
        last = fmt::format("{}: HTTP {}: {}", host, resp.status, resp.body.substr(0, 300));
        if (staleToken(resp.body)) {
          std::lock_guard<std::mutex> g(mutex_);
          token_.clear();
        } else if (!transientStatus(resp.status) && !transientBody(resp.body)) {
          throw CommError(fmt::format("etcd: cannot {}: {}", what, last));
        }
      } catch (const AuthRefused& refused) {
        last = fmt::format("{}: authenticating as etcd user '{}': HTTP {}: {}", host, options_.etcdUser,
                           refused.status, refused.body.substr(0, 300));
        if (!transientStatus(refused.status) && !transientBody(refused.body)) {
          throw CommError(fmt::format("etcd: cannot {}: {}", what, last));
        }
      } catch (const http::TransportError& err) {
        last = fmt::format("{}: {}", host, err.what());
        silent = true;
        if (!err.transient() || (scheme_ == "https://" && refusedCredentials(err.what()))) {
          throw CommError(fmt::format("etcd: cannot {}: {}{}", what, last,
                                      scheme_ == "https://" ? " (does this node present a certificate etcd "
                                                              "trusts? elastic.etcd_cert_file, etcd_key_file, "
                                                              "etcd_ca_file)"
                                                            : ""));
        }
      } catch (const Retry&) {
      }
      if (silent) {
        endpointFailed(e);
      } else {
        size_t expected = e;  // alive but not serving now: the next one, not avoided
        endpoint_.compare_exchange_strong(expected, (e + 1) % endpoints_.size());
      }
      if (Clock::now() + backoff > deadline) {
        // A TLS member answers plain http with nothing at all.
        const bool plainToTls = scheme_ == "http://" && last.find("Empty reply") != std::string::npos;
        throw CommError(fmt::format("etcd unreachable: cannot {} within {} s ({} attempts; last: {}){}", what,
                                    options_.retryFor.count() / 1000.0, attempt + 1, last,
                                    plainToTls ? " (does etcd serve TLS? then use etcds://)" : ""));
      }
      if (attempt == 0 || attempt % 10 == 0) log::debug("etcd: {} failed ({}); retrying", what, last);
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
  }

  void renewLoop(const std::string& id) {
    const auto every = std::max(std::chrono::milliseconds(50), options_.aliveTtl / 4);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!cv_.wait_for(lock, every, [&] { return stop_; })) {
      lock.unlock();
      try {
        const json r = call("/v3/lease/keepalive", {{"ID", id}}, "renew the lease");
        const json& res = r.contains("result") ? r["result"] : r;
        if (int64Of(res, "TTL") <= 0) {
          log::warn("etcd: lease {} expired: this node is no longer seen alive", id);
        }
      } catch (const std::exception& e) {
        log::warn("etcd: {}", e.what());
      }
      lock.lock();
    }
  }

  const std::vector<std::string> endpoints_;
  const std::string scheme_;
  const KvOptions options_;
  http::HttpClient http_;
  std::atomic<size_t> endpoint_{0};
  std::mutex avoidMutex_;
  std::vector<Clock::time_point> avoidUntil_;  // by endpoint
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string lease_;
  std::string token_;  // etcd user's, from /v3/auth/authenticate
  std::thread renewer_;
};

}  // namespace

std::unique_ptr<Kv> connectEtcd(const std::vector<std::string>& endpoints, bool tls, const KvOptions& options) {
  return std::make_unique<EtcdKv>(endpoints, tls, options);
}

}  // namespace cohort::elastic::detail
