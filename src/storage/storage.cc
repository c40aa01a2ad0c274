// openStorage(): which backend a URL names, how blob URLs are taken apart and
// where their credentials come from.

#include "cohort/storage/storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>

#include "cohort/config/job.h"
#include "cohort/core/env.h"
#include "cohort/core/text.h"
#include "storage/detail/backends.h"
#include "storage/detail/identity.h"
#include "storage/detail/shared_key.h"

namespace cohort::storage {
namespace {

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && lowerAscii(s.substr(0, prefix.size())) == prefix;
}

std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) out.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, size_t from) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) out += (out.empty() ? "" : "/") + parts[i];
  return out;
}

// scheme://authority/path?query, the pieces without their separators.
struct UrlParts {
  std::string scheme, authority, path, query;
};

UrlParts splitUrl(const std::string& url) {
  UrlParts p;
  const size_t colon = url.find("://");
  p.scheme = lowerAscii(url.substr(0, colon));
  std::string rest = url.substr(colon + 3);
  const size_t hash = rest.find('#');
  if (hash != std::string::npos) rest.resize(hash);
  const size_t q = rest.find('?');
  if (q != std::string::npos) {
    p.query = rest.substr(q + 1);
    rest.resize(q);
  }
  const size_t slash = rest.find('/');
  p.authority = rest.substr(0, slash);
  if (slash != std::string::npos) p.path = rest.substr(slash);
  const size_t at = p.authority.rfind('@');  // user:password@ never reaches a message
  if (at != std::string::npos) p.authority = p.authority.substr(at + 1);
  return p;
}

bool validContainer(const std::string& c) {
  if (c == "$root" || c == "$web") return true;
  if (c.size() < 3 || c.size() > 63) return false;
  return std::all_of(c.begin(), c.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-';
  });
}

void requireSecureOrAllowed(const std::string& scheme, const std::string& what,
                            const StorageOptions& options) {
  if (scheme == "http" && !options.allowInsecure) {
    throw ConfigError(fmt::format(
        "{}: plain http is allowed only with storage.allow_insecure: true (for the emulator); "
        "use https",
        what));
  }
  if (scheme != "http" && scheme != "https") {
    throw ConfigError(fmt::format("{}: expected http:// or https://", what));
  }
}

std::string unquote(const std::string& v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) {
    return v.substr(1, v.size() - 2);
  }
  return v;
}

}  // namespace

bool isRemoteUrl(const std::string& url) {
  return startsWith(url, "az://") || startsWith(url, "http://") || startsWith(url, "https://");
}

std::string redactUrl(const std::string& url) {
  if (url.find("://") == std::string::npos) return url.substr(0, url.find_first_of("?#"));
  const UrlParts p = splitUrl(url);
  return p.scheme + "://" + p.authority + p.path;
}

std::string joinUrl(const std::string& url, const std::string& name) {
  if (!isRemoteUrl(url)) return url + "/" + name;
  const size_t q = url.find('?');
  if (q == std::string::npos) return url + "/" + name;
  return url.substr(0, q) + "/" + name + url.substr(q);
}

namespace detail {

BlobLocation parseBlobUrl(const std::string& url, const StorageOptions& options) {
  BlobLocation loc;
  loc.display = redactUrl(url);
  const UrlParts p = splitUrl(url);
  loc.sasFromUrl = p.query;
  if (!loc.sasFromUrl.empty() && loc.sasFromUrl.find("sig=") == std::string::npos) {
    throw ConfigError(
        fmt::format("{}: the URL has a query string that is not a SAS token (no sig=); remove it",
                    loc.display));
  }
  const auto seg = segments(p.path);
  const std::string expect =
      "expected az://<account>/<container>[/<prefix>], "
      "https://<account>.blob.core.windows.net/<container>[/<prefix>] or "
      "http(s)://<host>:<port>/<account>/<container>[/<prefix>]";

  if (p.scheme == "az") {
    if (p.authority.empty() || seg.empty())
      throw ConfigError(fmt::format("{}: {}", loc.display, expect));
    loc.account = p.authority;
    loc.container = seg[0];
    loc.prefix = join(seg, 1);
    if (options.endpoint.empty()) {
      loc.scheme = "https";
      loc.authority = loc.account + ".blob.core.windows.net";
    } else {
      if (options.endpoint.find("://") == std::string::npos) {
        throw ConfigError(
            fmt::format("storage.endpoint '{}': expected http(s)://host[:port][/account]",
                        redactUrl(options.endpoint)));
      }
      const UrlParts ep = splitUrl(options.endpoint);
      requireSecureOrAllowed(
          ep.scheme, fmt::format("storage.endpoint '{}'", redactUrl(options.endpoint)), options);
      const auto epSeg = segments(ep.path);
      if (!epSeg.empty() && epSeg.back() != loc.account) {
        throw ConfigError(fmt::format(
            "{}: the account '{}' differs from the account '{}' storage.endpoint '{}' names",
            loc.display, loc.account, epSeg.back(), redactUrl(options.endpoint)));
      }
      loc.scheme = ep.scheme;
      loc.authority = ep.authority;
      loc.basePath = epSeg.empty() ? "" : "/" + join(epSeg, 0);
    }
  } else if (p.scheme == "http" || p.scheme == "https") {
    requireSecureOrAllowed(p.scheme, loc.display, options);
    loc.scheme = p.scheme;
    loc.authority = p.authority;
    const std::string host = lowerAscii(p.authority.substr(0, p.authority.find(':')));
    const size_t blob = host.find(".blob.");
    if (blob != std::string::npos && blob > 0) {
      // https://<account>.blob.core.windows.net/<container>/<prefix>
      if (seg.empty()) throw ConfigError(fmt::format("{}: {}", loc.display, expect));
      loc.account = host.substr(0, blob);
      loc.container = seg[0];
      loc.prefix = join(seg, 1);
    } else {
      // Path-style (the emulator): http://127.0.0.1:10000/<account>/<container>/<prefix>
      if (seg.size() < 2) throw ConfigError(fmt::format("{}: {}", loc.display, expect));
      loc.account = seg[0];
      loc.basePath = "/" + seg[0];
      loc.container = seg[1];
      loc.prefix = join(seg, 2);
    }
  } else {
    throw ConfigError(fmt::format("{}: not a blob URL; {}", loc.display, expect));
  }
  if (loc.authority.empty()) throw ConfigError(fmt::format("{}: no host; {}", loc.display, expect));
  if (!validContainer(loc.container)) {
    throw ConfigError(fmt::format(
        "{}: '{}' is not a valid container name (3-63 lower-case letters, digits and '-')",
        loc.display, loc.container));
  }
  return loc;
}

Credentials loadCredentials(const BlobLocation& location, const StorageOptions& options) {
  Credentials c;
  std::string keySource;
  std::string token;
  if (!options.credentialsFile.empty() && options.managedIdentity) {
    throw ConfigError(
        "storage: give credentials_file or managed_identity, not both");
  }
  if (!location.sasFromUrl.empty()) {
    c.sas = location.sasFromUrl;
  } else if (!options.credentialsFile.empty()) {
    const std::string& file = options.credentialsFile;
    std::ifstream in(file);
    if (!in) {
      throw ConfigError(fmt::format("storage.credentials_file '{}': cannot read it", file));
    }
    std::string line;
    std::string key, sas;
    for (int number = 1; std::getline(in, line); ++number) {
      line = trimSpace(line);
      if (line.empty() || line[0] == '#') continue;
      const size_t eq = line.find('=');
      // Never echo the line: it may hold a secret.
      if (eq == std::string::npos) {
        throw ConfigError(fmt::format(
            "{}:{}: expected `account_key = ...`, `sas = ...` or `token = ...`", file, number));
      }
      const std::string name = trimSpace(line.substr(0, eq));
      const std::string value = unquote(trimSpace(line.substr(eq + 1)));
      if (name == "account_key") {
        key = value;
      } else if (name == "sas") {
        sas = value;
      } else if (name == "token") {
        token = value;
      } else {
        throw ConfigError(fmt::format(
            "{}:{}: unknown key (expected account_key, sas or token)", file, number));
      }
    }
    if (key.empty() && sas.empty() && token.empty()) {
      throw ConfigError(fmt::format(
          "{}: holds neither `account_key = ...`, `sas = ...` nor `token = ...`", file));
    }
    c.keyText = key;
    c.sas = key.empty() ? sas : "";
    if (!key.empty() || !sas.empty()) token.clear();
    keySource = file;
  } else if (options.managedIdentity) {
    IdentityOptions io;
    if (!options.identityEndpoint.empty()) io.endpoint = options.identityEndpoint;
    io.clientId = options.identityClientId;
    io.maxRetries = options.maxRetries;
    io.timeoutS = options.timeoutS;
    c.bearer = managedIdentity(io);
  } else if (auto k = env::azureStorageKey()) {
    c.keyText = *k;
    keySource = "environment variable AZURE_STORAGE_KEY";
  } else if (auto sas = env::azureStorageSasToken()) {
    c.sas = *sas;
  } else if (auto t = env::azureStorageBearerToken()) {
    token = *t;
  } else {
    throw ConfigError(fmt::format(
        "{}: no credentials: set AZURE_STORAGE_KEY (the account key), AZURE_STORAGE_SAS_TOKEN "
        "(a SAS token) or AZURE_STORAGE_BEARER_TOKEN (an OAuth token) in the environment, "
        "storage.credentials_file to a file with `account_key = ...`, `sas = ...` or "
        "`token = ...`, or storage.managed_identity: true",
        location.display));
  }
  if (!token.empty()) c.bearer = fixedToken(trimSpace(token));
  if (c.bearer && location.scheme != "https") {
    throw ConfigError(fmt::format(
        "{}: OAuth tokens are sent over https only; this URL uses {}", location.display,
        location.scheme));
  }
  if (!c.sas.empty() && c.sas[0] == '?') c.sas.erase(0, 1);
  if (!c.keyText.empty()) {
    try {
      c.accountKey = detail::base64Decode(trimSpace(c.keyText));
    } catch (const std::exception&) {
      throw ConfigError(fmt::format("{}: the account key is not valid base64", keySource));
    }
    if (c.accountKey.empty())
      throw ConfigError(fmt::format("{}: the account key is empty", keySource));
  }
  return c;
}

}  // namespace detail

std::unique_ptr<Storage> openStorage(const std::string& url, const StorageOptions& options) {
  if (url.empty()) throw ConfigError("storage: empty path or URL");
  if (startsWith(url, "file://")) return detail::openLocalStorage(url.substr(7));
  if (isRemoteUrl(url)) {
    const auto location = detail::parseBlobUrl(url, options);
    return detail::openBlobStorage(location, detail::loadCredentials(location, options), options);
  }
  const size_t scheme = url.find("://");
  if (scheme != std::string::npos) {
    throw ConfigError(fmt::format(
        "{}: unknown scheme '{}://'; expected a path, file://, az://, http:// or https://",
        redactUrl(url), url.substr(0, scheme)));
  }
  return detail::openLocalStorage(url);
}

void createContainer(const std::string& url, const StorageOptions& options) {
  if (!isRemoteUrl(url)) {
    throw ConfigError(
        fmt::format("{}: not a blob URL (az://, http:// or https://)", redactUrl(url)));
  }
  const auto location = detail::parseBlobUrl(url, options);
  detail::createBlobContainer(location, detail::loadCredentials(location, options), options);
}

StorageOptions storageOptions(const StorageConfig& config) {
  StorageOptions o;
  o.credentialsFile = config.credentialsFile;
  o.managedIdentity = config.managedIdentity;
  o.identityClientId = config.identityClientId;
  o.identityEndpoint = config.identityEndpoint;
  o.endpoint = config.endpoint;
  o.caFile = config.caFile;
  o.allowInsecure = config.allowInsecure;
  o.maxRetries = static_cast<int>(config.maxRetries);
  o.timeoutS = config.timeoutS;
  return o;
}

}  // namespace cohort::storage
