#pragma once

// One HTTP request over libcurl, without retries (callers retry: the blob
// storage client, the etcd client).
// Easy handles are pooled so that connections (and TLS sessions) are reused
// across requests; an HttpClient may be used from several threads at once.

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cohort::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST or DELETE
  std::string url;     // with its query string
  Headers headers;
  // PUT, POST: the body, sent with a Content-Length. Not owned.
  const std::string* body = nullptr;
  // When set, the body of a 2xx response is passed here as it arrives
  // instead of being collected in HttpResponse::body. It may throw: the
  // transfer is aborted and perform() rethrows.
  std::function<void(const char* data, size_t size)> sink;
  // > 0: the whole request ends by then (a TransportError of kind timeout),
  // for a response that streams without end (an etcd watch).
  double totalTimeoutS = 0;
};

struct HttpResponse {
  int status = 0;
  Headers headers;   // names in lower case
  std::string body;  // error bodies (capped) always; 2xx bodies without a sink
  std::optional<std::string> header(const std::string& lowerName) const;
};

// The request got no HTTP response. `transient`: retrying may succeed
// (timeouts, refused or reset connections); not for failed certificate
// verification or a malformed request. The message names no URL.
class TransportError : public std::runtime_error {
 public:
  enum class Kind { timeout, connection, tls, other };
  TransportError(const std::string& what, Kind kind) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }
  bool transient() const { return kind_ == Kind::timeout || kind_ == Kind::connection; }

 private:
  Kind kind_;
};

struct HttpOptions {
  std::string caFile;     // PEM bundle; empty: the system's
  bool insecure = false;  // no certificate verification
  double timeoutS = 60;   // connect, and the longest stretch with no byte moving
  // A client certificate (PEM) and its key, presented to servers that ask
  // for one; empty: none.
  std::string certFile, keyFile;
};

class HttpClient {
 public:
  explicit HttpClient(HttpOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends one request and waits for the whole response (bounded by the
  // timeouts above). Any HTTP status is a response; throws TransportError
  // when there is none, or what the sink threw.
  HttpResponse perform(const HttpRequest& request);

 private:
  void* acquire();  // a CURL*, reset
  void release(void* handle);

  HttpOptions options_;
  std::mutex mutex_;
  std::vector<void*> idle_;
};

}  // namespace cohort::http
