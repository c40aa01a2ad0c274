#pragma once

// OAuth bearer tokens for blob storage: a fixed token (from the
// environment or a credentials file) or tokens from Azure's managed-identity
// endpoint (IMDS), fetched when first needed and again when fewer than five
// minutes of a token's lifetime are left.

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "cohort/storage/storage.h"
#include "core/detail/http.h"

namespace cohort::storage::detail {

// The HTTP client is core's (core/detail/http.h).
using namespace cohort::http;

// The resource (audience) of tokens for Azure Storage.
inline constexpr const char* kStorageResource = "https://storage.azure.com/";
// Azure's instance metadata service, reachable from inside a VM only.
inline constexpr const char* kImdsTokenEndpoint =
    "http://169.254.169.254/metadata/identity/oauth2/token";

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // A token valid for a while yet. Throws StorageError (the endpoint failed)
  // or ConfigError (it answered something that is not a token).
  virtual std::string token() = 0;
  // The server refused the last token (401): the next token() fetches anew.
  virtual void invalidate() {}
  // The token handed out last, to scrub from messages; empty if none.
  virtual std::string last() const = 0;
};

std::shared_ptr<TokenSource> fixedToken(std::string token);

struct IdentityOptions {
  std::string endpoint = kImdsTokenEndpoint;
  std::string clientId;  // a user-assigned identity; empty: the system-assigned one
  int maxRetries = 5;    // transient failures (5xx, 429, 404 and 410 while IMDS starts)
  double timeoutS = 60;
  double retryBaseS = 0.2;
  double retryMaxS = 10;
};
std::shared_ptr<TokenSource> managedIdentity(const IdentityOptions& options);

// Parses the endpoint's JSON answer: {"access_token": ..., "expires_on":
// epoch seconds (string or number)} or "expires_in" seconds from `now`.
// Throws ConfigError naming `endpoint` when there is no token in it.
struct IssuedToken {
  std::string token;
  std::chrono::system_clock::time_point expires;
};
IssuedToken parseTokenResponse(const std::string& body, const std::string& endpoint,
                               std::chrono::system_clock::time_point now);

}  // namespace cohort::storage::detail
