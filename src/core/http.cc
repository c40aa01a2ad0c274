#include "core/detail/http.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <exception>

#include "cohort/core/text.h"

namespace cohort::http {
namespace {

constexpr size_t kMaxErrorBody = 64 << 10;

void globalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// State of one transfer, shared with the callbacks.
struct Transfer {
  const HttpRequest* request = nullptr;
  const std::string* body = nullptr;  // PUT: what is sent
  HttpResponse response;
  size_t uploaded = 0;
  std::exception_ptr sinkError;
};

size_t onHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string line(data, size * count);
  if (line.rfind("HTTP/", 0) == 0) {
    // A new response (after 100 Continue, say): start over.
    t->response.headers.clear();
    const size_t sp = line.find(' ');
    t->response.status = sp == std::string::npos ? 0 : std::atoi(line.c_str() + sp + 1);
    return size * count;
  }
  const size_t colon = line.find(':');
  if (colon != std::string::npos) {
    t->response.headers.emplace_back(lowerAscii(trimSpace(line.substr(0, colon))),
                                     trimSpace(line.substr(colon + 1)));
  }
  return size * count;
}

size_t onBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  const int status = t->response.status;
  const bool ok = status >= 200 && status < 300;
  if (ok && t->request->sink) {
    try {
      t->request->sink(data, n);
    } catch (...) {
      t->sinkError = std::current_exception();
      return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
    }
    return n;
  }
  if (ok || t->response.body.size() < kMaxErrorBody) t->response.body.append(data, n);
  return n;
}

size_t onRead(char* buffer, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string& body = *t->body;
  const size_t n = std::min(size * count, body.size() - t->uploaded);
  std::memcpy(buffer, body.data() + t->uploaded, n);
  t->uploaded += n;
  return n;
}

// Lets curl resend the body (after a redirect or an authentication round).
int onSeek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > t->body->size()) {
    return CURL_SEEKFUNC_FAIL;
  }
  t->uploaded = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

TransportError::Kind classify(CURLcode code) {
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
      return TransportError::Kind::timeout;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:  // a handshake cut short, not a verdict on the certificate
      return TransportError::Kind::connection;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
      return TransportError::Kind::tls;
    default:
      return TransportError::Kind::other;
  }
}

}  // namespace

std::optional<std::string> HttpResponse::header(const std::string& lowerName) const {
  for (const auto& [name, value] : headers) {
    if (name == lowerName) return value;
  }
  return std::nullopt;
}

HttpClient::HttpClient(HttpOptions options) : options_(std::move(options)) { globalInit(); }

HttpClient::~HttpClient() {
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* HttpClient::acquire() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      // Keeps the handle's live connections and TLS session cache.
      curl_easy_reset(static_cast<CURL*>(h));
      return h;
    }
  }
  CURL* h = curl_easy_init();
  if (h == nullptr) throw TransportError("curl_easy_init failed", TransportError::Kind::other);
  return h;
}

void HttpClient::release(void* handle) {
  std::lock_guard<std::mutex> g(mutex_);
  idle_.push_back(handle);
}

HttpResponse HttpClient::perform(const HttpRequest& request) {
  CURL* h = static_cast<CURL*>(acquire());
  struct Releaser {
    HttpClient* client;
    CURL* h;
    curl_slist* headers = nullptr;
    ~Releaser() {
      curl_slist_free_all(headers);
      client->release(h);
    }
  } guard{this, h};

  Transfer t;
  t.request = &request;
  char errorBuffer[CURL_ERROR_SIZE] = {0};

  curl_easy_setopt(h, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errorBuffer);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, onHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, onBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);

  // Timeouts: connecting, then any stretch with (next to) no byte moving.
  // A total time limit would cut off large transfers that are progressing.
  const long timeoutMs = std::max(1L, std::lround(options_.timeoutS * 1000));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeoutMs);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, std::max(1L, std::lround(options_.timeoutS)));

  if (options_.insecure) {
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
  } else if (!options_.caFile.empty()) {
    curl_easy_setopt(h, CURLOPT_CAINFO, options_.caFile.c_str());
  }
  if (!options_.certFile.empty()) {
    curl_easy_setopt(h, CURLOPT_SSLCERT, options_.certFile.c_str());
    curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
    curl_easy_setopt(h, CURLOPT_SSLKEY, options_.keyFile.c_str());
    curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
  }

  if (request.method == "GET") {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else if (request.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT") {
    static const std::string kEmpty;
    t.body = request.body != nullptr ? request.body : &kEmpty;
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, onRead);
    curl_easy_setopt(h, CURLOPT_READDATA, &t);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, onSeek);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(t.body->size()));
  } else if (request.method == "POST") {
    static const std::string kEmpty;
    const std::string& body = request.body != nullptr ? *request.body : kEmpty;
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  } else {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  if (request.totalTimeoutS > 0) {
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, std::max(1L, std::lround(request.totalTimeoutS * 1000)));
  }

  for (const auto& [name, value] : request.headers) {
    guard.headers = curl_slist_append(guard.headers, (name + ": " + value).c_str());
  }
  // No "Expect: 100-continue" round trip before a block's body.
  guard.headers = curl_slist_append(guard.headers, "Expect:");
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, guard.headers);

  const CURLcode rc = curl_easy_perform(h);
  if (t.sinkError) std::rethrow_exception(t.sinkError);
  if (rc != CURLE_OK) {
    const auto kind = classify(rc);
    std::string detail = errorBuffer[0] != '\0' ? errorBuffer : curl_easy_strerror(rc);
    while (!detail.empty() && (detail.back() == '\n' || detail.back() == '\r')) detail.pop_back();
    std::string what;
    if (kind == TransportError::Kind::timeout) {
      what = request.totalTimeoutS > 0
                 ? fmt::format("timed out (after {} s): {}", request.totalTimeoutS, detail)
                 : fmt::format("timed out ({} s without progress): {}", options_.timeoutS, detail);
    } else if (kind == TransportError::Kind::tls) {
      what = fmt::format("TLS certificate verification failed: {}", detail);
    } else {
      what = detail;
    }
    throw TransportError(what, kind);
  }
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  t.response.status = static_cast<int>(status);
  return std::move(t.response);
}

}  // namespace cohort::http
