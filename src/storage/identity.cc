// Bearer tokens for blob storage (storage/detail/identity.h).
//
// The managed-identity flow, as Azure documents it for VMs: GET the IMDS
// token endpoint with `Metadata: true`, api-version, the resource and
// optionally a client id; the JSON answer carries access_token and
// expires_on. The token is never logged; messages quote the endpoint and
// the service's error description only.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "storage/detail/identity.h"
#include "storage/detail/shared_key.h"

namespace cohort::storage::detail {
namespace {

using SysClock = std::chrono::system_clock;
constexpr std::chrono::minutes kRefreshBefore{5};

class FixedToken final : public TokenSource {
 public:
  explicit FixedToken(std::string token) : token_(std::move(token)) {}
  std::string token() override { return token_; }
  std::string last() const override { return token_; }

 private:
  std::string token_;
};

bool transientIdentityStatus(int status) {
  // IMDS answers 404 and 410 while it starts or updates; 429 when throttled.
  return status >= 500 || status == 429 || status == 404 || status == 410 || status == 408;
}

// The error description of an OAuth error body, if it has one.
std::string describeError(const std::string& body) {
  try {
    const auto j = nlohmann::json::parse(body);
    for (const char* k : {"error_description", "error", "message"}) {
      if (j.contains(k) && j[k].is_string()) return j[k].get<std::string>();
    }
  } catch (const std::exception&) {
  }
  return {};
}

class ManagedIdentity final : public TokenSource {
 public:
  explicit ManagedIdentity(IdentityOptions o)
      : options_(std::move(o)), http_(HttpOptions{"", false, options_.timeoutS, "", ""}) {}

  std::string token() override {
    std::lock_guard<std::mutex> g(mutex_);
    if (token_.empty() || SysClock::now() + kRefreshBefore >= expires_) fetch();
    return token_;
  }
  void invalidate() override {
    std::lock_guard<std::mutex> g(mutex_);
    expires_ = SysClock::time_point::min();
  }
  std::string last() const override {
    std::lock_guard<std::mutex> g(mutex_);
    return token_;
  }

 private:
  void fetch() {
    Query q{{"api-version", "2018-02-01"}, {"resource", kStorageResource}};
    if (!options_.clientId.empty()) q.emplace_back("client_id", options_.clientId);
    HttpRequest r;
    r.method = "GET";
    r.url = options_.endpoint + "?" + encodeQuery(q);
    r.headers = {{"Metadata", "true"}};
    const std::string shown = "managed identity endpoint " + options_.endpoint;
    for (int attempt = 0;; ++attempt) {
      std::string reason;
      bool transient = false;
      int status = 0;
      try {
        const HttpResponse response = http_.perform(r);
        status = response.status;
        if (status >= 200 && status < 300) {
          IssuedToken t = parseTokenResponse(response.body, options_.endpoint, SysClock::now());
          token_ = std::move(t.token);
          expires_ = t.expires;
          return;
        }
        const std::string why = describeError(response.body);
        reason = why.empty() ? std::to_string(status) : fmt::format("{} {}", status, why);
        transient = transientIdentityStatus(status);
      } catch (const TransportError& e) {
        reason = e.what();
        transient = e.transient();
      }
      if (!transient || attempt >= options_.maxRetries) {
        throw StorageError(fmt::format("{}: no token for {}: {}{}", shown, kStorageResource,
                                       reason,
                                       attempt > 0 ? fmt::format(" (after {} attempts)", attempt + 1)
                                                   : std::string()),
                           status, transient, attempt + 1);
      }
      const double full = std::min(options_.retryMaxS,
                                   options_.retryBaseS * std::pow(2.0, std::min(attempt, 30)));
      const double delay = full * std::uniform_real_distribution<double>(0.5, 1.0)(rng_);
      log::warn("{}: {}; retry {}/{} in {:.2f} s", shown, reason, attempt + 1, options_.maxRetries,
                delay);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    }
  }

  IdentityOptions options_;
  HttpClient http_;
  mutable std::mutex mutex_;
  std::string token_;
  SysClock::time_point expires_ = SysClock::time_point::min();
  std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace

std::shared_ptr<TokenSource> fixedToken(std::string token) {
  return std::make_shared<FixedToken>(std::move(token));
}

std::shared_ptr<TokenSource> managedIdentity(const IdentityOptions& options) {
  return std::make_shared<ManagedIdentity>(options);
}

IssuedToken parseTokenResponse(const std::string& body, const std::string& endpoint,
                               SysClock::time_point now) {
  auto bad = [&](const std::string& what) {
    return ConfigError(fmt::format("managed identity endpoint {}: {}", endpoint, what));
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const std::exception&) {
    throw bad("the answer is not JSON");
  }
  if (!j.is_object() || !j.contains("access_token") || !j["access_token"].is_string() ||
      j["access_token"].get<std::string>().empty()) {
    throw bad("the answer holds no access_token");
  }
  // A number or a string of digits.
  auto seconds = [&](const char* key) -> std::optional<int64_t> {
    if (!j.contains(key)) return std::nullopt;
    const auto& v = j[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (!s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), ::isdigit)) {
        return std::stoll(s);
      }
    }
    throw bad(fmt::format("{} is not a number of seconds", key));
  };
  IssuedToken t;
  t.token = j["access_token"].get<std::string>();
  if (auto on = seconds("expires_on")) {
    t.expires = SysClock::time_point(std::chrono::seconds(*on));
  } else if (auto in = seconds("expires_in")) {
    t.expires = now + std::chrono::seconds(*in);
  } else {
    throw bad("the answer says neither expires_on nor expires_in");
  }
  return t;
}

}  // namespace cohort::storage::detail
