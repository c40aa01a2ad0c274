// Credentials inside URLs (a SAS token as a blob URL's query string) held
// apart from the job, so that every text written from it (job.yaml, the
// output of `cohort validate`, checkpoint manifests, job hashes) is free of
// them. Walks the same schema as the parser: every string key is covered,
// including keys added later.

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "config/detail/schema.h"

namespace cohort {
namespace detail {
namespace {

// Where a URL's query string starts, for the URL schemes storage reads;
// npos for anything else (local paths may contain '?').
size_t credentialQuery(const std::string& value) {
  for (const char* scheme : {"az://", "http://", "https://"}) {
    if (value.rfind(scheme, 0) == 0) return value.find('?');
  }
  return std::string::npos;
}

class Taker {
 public:
  explicit Taker(UrlCredentials& out) : out_(out) {}
  template <class T>
  void field(const char*, T& value, const char*, const Rule& = {}) {
    if constexpr (std::is_same_v<T, std::string>) {
      const size_t q = credentialQuery(value);
      if (q == std::string::npos) return;
      std::string query = value.substr(q + 1);
      value.erase(q);
      if (!query.empty()) out_[value] = std::move(query);
    }
  }
  template <class S>
  void section(const char*, S& value, const char*) {
    describe(*this, value);
  }

 private:
  UrlCredentials& out_;
};

class Restorer {
 public:
  explicit Restorer(const UrlCredentials& in) : in_(in) {}
  template <class T>
  void field(const char*, T& value, const char*, const Rule& = {}) {
    if constexpr (std::is_same_v<T, std::string>) {
      if (credentialQuery(value) != std::string::npos) return;  // has its own
      auto it = in_.find(value);
      if (it != in_.end()) value += "?" + it->second;
    }
  }
  template <class S>
  void section(const char*, S& value, const char*) {
    describe(*this, value);
  }

 private:
  const UrlCredentials& in_;
};

}  // namespace
}  // namespace detail

UrlCredentials takeUrlCredentials(JobConfig& job) {
  UrlCredentials out;
  detail::Taker t(out);
  detail::describe(t, job);
  return out;
}

void restoreUrlCredentials(JobConfig& job, const UrlCredentials& credentials) {
  if (credentials.empty()) return;
  detail::Restorer r(credentials);
  detail::describe(r, job);
}

std::string encodeUrlCredentials(const UrlCredentials& credentials) {
  return nlohmann::json(credentials).dump();
}

UrlCredentials decodeUrlCredentials(const std::string& text, const std::string& origin) {
  // The message never quotes the text: it holds secrets.
  try {
    const auto j = nlohmann::json::parse(text);
    if (!j.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object of URL credentials", origin));
    UrlCredentials out;
    for (const auto& [url, query] : j.items()) {
      if (!query.is_string()) {
        throw ConfigError(fmt::format("{}: the credentials of {} are not a string", origin, url));
      }
      out[url] = query.get<std::string>();
    }
    return out;
  } catch (const nlohmann::json::exception&) {
    throw ConfigError(fmt::format("{}: not a JSON object of URL credentials", origin));
  }
}

}  // namespace cohort
