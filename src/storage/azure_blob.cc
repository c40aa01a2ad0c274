// Azure Blob Storage over its REST API (libcurl, OpenSSL for Shared Key).
//
// Every request goes through BlobClient::send(), which signs it (Shared Key)
// or appends the SAS token, and retries transient failures:
//
//   for attempt in 0..maxRetries:
//     response = perform(request)            # signed anew: x-ms-date moves
//     if 2xx or an accepted status: return it
//     if not transient (4xx but 408/429, TLS verification): throw at once
//     sleep min(retryMaxS, retryBaseS * 2^attempt) jittered to [1/2, 1] of it,
//           or the server's Retry-After (capped at retryMaxS)
//   throw the last failure
//
// Messages name the operation and the URL without its query string; the
// account key and SAS never reach a message or a log line.

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "cohort/core/log.h"
#include "storage/detail/backends.h"
#include "core/detail/http.h"
#include "storage/detail/identity.h"
#include "storage/detail/shared_key.h"
#include "storage/detail/xml.h"

namespace cohort::storage::detail {
namespace {

// A version of the REST API the service and Azurite 3.x both accept.
constexpr const char* kApiVersion = "2021-08-06";
constexpr int kMaxBlocks = 50000;  // the service's limit per blob

struct Call {
  Call(std::string m, std::string p) : method(std::move(m)), path(std::move(p)) {}
  std::string method;
  std::string path;     // encoded, from the origin: "/<container>/<blob>"
  std::string context;  // appended to the URL in messages: " (block 3/9)"
  Query query;          // decoded
  Headers headers;
  const std::string* body = nullptr;
  std::function<void(const char*, size_t)> sink;
  // Called before every attempt (a resumed download sets its range).
  std::function<void(Call&)> beforeAttempt;
  std::vector<int> accept;  // non-2xx statuses returned instead of thrown
};

bool transientStatus(int status) { return status >= 500 || status == 429 || status == 408; }

class BlobClient {
 public:
  BlobClient(BlobLocation location, Credentials credentials, const StorageOptions& options)
      : location_(std::move(location)),
        credentials_(std::move(credentials)),
        options_(options),
        http_(HttpOptions{options.caFile, options.allowInsecure, options.timeoutS, "", ""}) {}

  const BlobLocation& location() const { return location_; }
  const StorageOptions& options() const { return options_; }

  // The encoded path of object `name` (relative to the prefix).
  std::string blobPath(const std::string& name) const {
    return location_.containerPath() + "/" + percentEncode(fullName(name), true);
  }
  std::string fullName(const std::string& name) const {
    return location_.prefix.empty() ? name : location_.prefix + "/" + name;
  }
  std::string url(const std::string& path) const { return location_.origin() + path; }

  HttpResponse send(Call& call) {
    const std::string shown = url(call.path) + call.context;
    bool refreshed = false;
    for (int attempt = 0;; ++attempt) {
      if (call.beforeAttempt) call.beforeAttempt(call);
      HttpRequest request = build(call);
      std::string reason;
      bool transient = false;
      std::optional<double> retryAfter;
      int status = 0;
      try {
        HttpResponse response = http_.perform(request);
        status = response.status;
        if ((status >= 200 && status < 300) ||
            std::find(call.accept.begin(), call.accept.end(), status) != call.accept.end()) {
          return response;
        }
        std::string code = response.header("x-ms-error-code").value_or("");
        if (code.empty()) code = errorCodeFromBody(response.body);
        reason = code.empty() ? std::to_string(status) : fmt::format("{} {}", status, code);
        transient = transientStatus(status);
        // An OAuth token revoked or expired early: one more try with a new one.
        if (status == 401 && credentials_.bearer && !refreshed) {
          refreshed = true;
          transient = true;
          credentials_.bearer->invalidate();
        }
        if (auto ra = response.header("retry-after")) {
          try {
            retryAfter = std::stod(*ra);
          } catch (const std::exception&) {
            // An HTTP date instead of seconds: use our own backoff.
          }
        }
      } catch (const TransportError& e) {
        reason = scrub(e.what());
        transient = e.transient();
      }
      if (!transient || attempt >= options_.maxRetries) {
        const std::string after =
            attempt > 0 ? fmt::format(" (after {} attempts)", attempt + 1) : std::string();
        throw StorageError(fmt::format("{} {}: {}{}", call.method, shown, reason, after), status,
                           transient, attempt + 1);
      }
      double delay = backoff(attempt);
      std::string why;
      if (retryAfter && *retryAfter >= 0) {
        delay = std::min(*retryAfter, options_.retryMaxS);
        why = " (Retry-After)";
      }
      log::warn("{} {}: {}; retry {}/{} in {:.2f} s{}", call.method, shown, reason, attempt + 1,
                options_.maxRetries, delay, why);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    }
  }

 private:
  HttpRequest build(const Call& call) const {
    HttpRequest r;
    r.method = call.method;
    r.headers = call.headers;
    r.headers.emplace_back("x-ms-date", httpDate());
    r.headers.emplace_back("x-ms-version", kApiVersion);
    r.body = call.body;
    r.sink = call.sink;
    std::string query = encodeQuery(call.query);
    if (!credentials_.accountKey.empty()) {
      const int64_t length = call.body ? static_cast<int64_t>(call.body->size()) : 0;
      const std::string toSign = sharedKeyStringToSign(location_.account, call.method, call.path,
                                                       call.query, r.headers, length);
      r.headers.emplace_back(
          "Authorization",
          sharedKeyAuthorization(location_.account, credentials_.accountKey, toSign));
    } else if (!credentials_.sas.empty()) {
      query += (query.empty() ? "" : "&") + credentials_.sas;
    } else if (credentials_.bearer) {
      r.headers.emplace_back("Authorization", "Bearer " + credentials_.bearer->token());
    }
    r.url = url(call.path) + (query.empty() ? "" : "?" + query);
    return r;
  }

  double backoff(int attempt) {
    const double full =
        std::min(options_.retryMaxS, options_.retryBaseS * std::pow(2.0, std::min(attempt, 30)));
    std::lock_guard<std::mutex> g(rngMutex_);
    return full * std::uniform_real_distribution<double>(0.5, 1.0)(rng_);
  }

  // Defence in depth: curl's messages name hosts, never credentials, but a
  // secret must not slip into a message through some other path either.
  std::string scrub(std::string s) const {
    const std::string token = credentials_.bearer ? credentials_.bearer->last() : std::string();
    for (const std::string* secret : {&credentials_.sas, &credentials_.keyText, &token}) {
      if (secret->empty()) continue;
      for (size_t p; (p = s.find(*secret)) != std::string::npos;)
        s.replace(p, secret->size(), "***");
    }
    return s;
  }

  BlobLocation location_;
  Credentials credentials_;
  StorageOptions options_;
  HttpClient http_;
  std::mutex rngMutex_;
  std::mt19937_64 rng_{std::random_device{}()};
};

class BlobStorage final : public Storage {
 public:
  BlobStorage(const BlobLocation& location, const Credentials& credentials,
              const StorageOptions& options)
      : client_(location, credentials, options) {}

  std::string describe() const override { return client_.location().display; }

  int64_t size(const std::string& name) override {
    Call call{"HEAD", client_.blobPath(name)};
    const HttpResponse r = client_.send(call);
    return contentLength(r, call);
  }

  bool exists(const std::string& name) override {
    Call call{"HEAD", client_.blobPath(name)};
    call.accept = {404};
    return client_.send(call).status != 404;
  }

  std::string readRange(const std::string& name, int64_t offset, int64_t length) override {
    if (length <= 0) {
      const int64_t total = size(name);
      if (offset > total) throw pastTheEnd(name, offset, length, total);
      return {};
    }
    Call call{"GET", client_.blobPath(name)};
    call.headers.emplace_back("x-ms-range",
                              fmt::format("bytes={}-{}", offset, offset + length - 1));
    call.accept = {416};
    HttpResponse r = client_.send(call);
    if (r.status == 416 || static_cast<int64_t>(r.body.size()) != length) {
      throw pastTheEnd(name, offset, length,
                       r.status == 416 ? -1 : offset + static_cast<int64_t>(r.body.size()));
    }
    return std::move(r.body);
  }

  void readToFile(const std::string& name, const std::string& localPath,
                  const std::function<void(int64_t)>& progress) override {
    const int fd = ::open(localPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw StorageError(fmt::format("cannot create {}: {}", localPath, std::strerror(errno)), 0,
                         false);
    }
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    int64_t received = 0;
    Call call{"GET", client_.blobPath(name)};
    call.sink = [&](const char* data, size_t n) {
      while (n > 0) {
        const ssize_t w = ::write(fd, data, n);
        if (w < 0) {
          if (errno == EINTR) continue;
          throw StorageError(fmt::format("cannot write {}: {}", localPath, std::strerror(errno)), 0,
                             false);
        }
        data += w;
        n -= static_cast<size_t>(w);
        received += w;
      }
      if (progress) progress(received);
    };
    // A retry after a broken transfer continues where it stopped.
    call.beforeAttempt = [&](Call& c) {
      c.headers.clear();
      if (received > 0) c.headers.emplace_back("x-ms-range", fmt::format("bytes={}-", received));
    };
    client_.send(call);
  }

  void writeFromFile(const std::string& name, const std::string& localPath) override {
    const int fd = ::open(localPath.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw StorageError(fmt::format("cannot open {}: {}", localPath, std::strerror(errno)), 0,
                         false);
    }
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    const off_t total = ::lseek(fd, 0, SEEK_END);
    if (total < 0) {
      throw StorageError(fmt::format("cannot read {}: {}", localPath, std::strerror(errno)), 0,
                         false);
    }
    auto readAt = [&](int64_t offset, int64_t length) {
      std::string buf(static_cast<size_t>(length), '\0');
      int64_t got = 0;
      while (got < length) {
        const ssize_t n = ::pread(fd, buf.data() + got, static_cast<size_t>(length - got),
                                  static_cast<off_t>(offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          throw StorageError(
              fmt::format("cannot read {}: {}", localPath,
                          n == 0 ? "file shrank while uploading" : std::strerror(errno)),
              0, false);
        }
        got += n;
      }
      return buf;
    };
    upload(name, total, readAt);
  }

  void writeBytes(const std::string& name, const std::string& data) override {
    upload(name, static_cast<int64_t>(data.size()), [&](int64_t offset, int64_t length) {
      return data.substr(static_cast<size_t>(offset), static_cast<size_t>(length));
    });
  }

  std::vector<ObjectInfo> list(const std::string& prefix) override {
    const std::string& root = client_.location().prefix;
    const std::string strip = root.empty() ? "" : root + "/";
    const std::string full = strip + prefix;
    std::vector<ObjectInfo> out;
    std::string marker;
    do {
      Call call{"GET", client_.location().containerPath()};
      call.context = fmt::format(" (list, prefix '{}')", full);
      call.query = {{"restype", "container"},
                    {"comp", "list"},
                    {"prefix", full},
                    {"maxresults", std::to_string(std::max(1, client_.options().listPageSize))}};
      if (!marker.empty()) call.query.emplace_back("marker", marker);
      const HttpResponse r = client_.send(call);
      ListPage page;
      try {
        page = parseListPage(r.body);
      } catch (const std::exception& e) {
        throw StorageError(fmt::format("GET {}{}: malformed response: {}", client_.url(call.path),
                                       call.context, e.what()),
                           r.status, false);
      }
      for (auto& b : page.blobs) {
        if (b.name.compare(0, strip.size(), strip) != 0) continue;
        out.push_back({b.name.substr(strip.size()), b.size});
      }
      marker = page.nextMarker;
    } while (!marker.empty());
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.name < b.name; });
    return out;
  }

  void remove(const std::string& name) override {
    Call call{"DELETE", client_.blobPath(name)};
    call.accept = {404};
    client_.send(call);
  }

 private:
  // One Put Blob up to blockBytes, else Put Block per block and Put Block
  // List: the object appears complete or not at all.
  void upload(const std::string& name, int64_t total,
              const std::function<std::string(int64_t, int64_t)>& readAt) {
    const int64_t block =
        std::max<int64_t>({1, client_.options().blockBytes, (total + kMaxBlocks - 1) / kMaxBlocks});
    const std::string path = client_.blobPath(name);
    if (total <= block) {
      const std::string body = readAt(0, total);
      Call call{"PUT", path};
      call.headers = {{"x-ms-blob-type", "BlockBlob"}};
      call.body = &body;
      client_.send(call);
      return;
    }
    const int64_t blocks = (total + block - 1) / block;
    std::string list = "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<BlockList>\n";
    for (int64_t i = 0; i < blocks; ++i) {
      // Every id of a blob has the same length.
      const std::string id = base64Encode(fmt::format("cohort-block-{:08d}", i));
      const int64_t offset = i * block;
      const std::string body = readAt(offset, std::min(block, total - offset));
      Call call{"PUT", path};
      call.context = fmt::format(" (block {}/{})", i + 1, blocks);
      call.query = {{"comp", "block"}, {"blockid", id}};
      call.body = &body;
      client_.send(call);
      list += "<Latest>" + id + "</Latest>\n";
    }
    list += "</BlockList>\n";
    Call call{"PUT", path};
    call.context = " (block list)";
    call.query = {{"comp", "blocklist"}};
    call.headers = {{"Content-Type", "application/xml"}};
    call.body = &list;
    client_.send(call);
  }

  int64_t contentLength(const HttpResponse& r, const Call& call) const {
    const auto v = r.header("content-length");
    try {
      if (v) return std::stoll(*v);
    } catch (const std::exception&) {
    }
    throw StorageError(fmt::format("{} {}: response without a valid Content-Length", call.method,
                                   client_.url(call.path)),
                       r.status, false);
  }

  StorageError pastTheEnd(const std::string& name, int64_t offset, int64_t length,
                          int64_t available) const {
    const std::string where = client_.url(client_.blobPath(name));
    if (available < 0) {
      return StorageError(fmt::format("GET {}: {} bytes at offset {} requested, past the end of "
                                      "the object (416 InvalidRange)",
                                      where, length, offset),
                          416, false);
    }
    return StorageError(
        fmt::format("GET {}: {} bytes at offset {} requested, the object ends at {}", where, length,
                    offset, available),
        416, false);
  }

  BlobClient client_;
};

}  // namespace

std::unique_ptr<Storage> openBlobStorage(const BlobLocation& location,
                                         const Credentials& credentials,
                                         const StorageOptions& options) {
  return std::make_unique<BlobStorage>(location, credentials, options);
}

void createBlobContainer(const BlobLocation& location, const Credentials& credentials,
                         const StorageOptions& options) {
  BlobClient client(location, credentials, options);
  Call call{"PUT", location.containerPath()};
  call.query = {{"restype", "container"}};
  call.accept = {409};
  const HttpResponse r = client.send(call);
  if (r.status == 409) {
    std::string code = r.header("x-ms-error-code").value_or("");
    if (code.empty()) code = errorCodeFromBody(r.body);
    if (code != "ContainerAlreadyExists") {
      throw StorageError(fmt::format("PUT {}: 409 {}", client.url(location.containerPath()), code),
                         409, false);
    }
  }
}

}  // namespace cohort::storage::detail
