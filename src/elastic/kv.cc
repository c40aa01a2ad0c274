#include "cohort/elastic/kv.h"

#include <fmt/format.h>

#include "cohort/core/error.h"
#include "cohort/core/text.h"
#include "elastic/detail/kv_backends.h"

namespace cohort::elastic {
namespace {

// "host:port" (a bracketed IPv6 address allowed) into its parts.
std::pair<std::string, int> hostPort(const std::string& text, const std::string& url) {
  const size_t colon = text.rfind(':');
  const auto bad = [&](const char* why) {
    return ConfigError(fmt::format("--rdzv {}: {} in '{}' (expected HOST:PORT)", url, why, text));
  };
  if (colon == std::string::npos || colon == 0) throw bad("no port");
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw bad("the port is not a number");
  }
  if (port <= 0 || port > 65535) throw bad("the port is out of range");
  return {host, port};
}

}  // namespace

std::unique_ptr<Kv> connectKv(const std::string& url, const KvOptions& options) {
  const size_t sep = url.find("://");
  const std::string scheme = sep == std::string::npos ? "" : url.substr(0, sep);
  const std::string rest = sep == std::string::npos ? "" : url.substr(sep + 3);
  if (scheme == "etcd" || scheme == "etcds") {
    const bool tls = scheme == "etcds";
    if (!tls && !(options.etcdCaFile.empty() && options.etcdCertFile.empty() && options.etcdUser.empty())) {
      throw ConfigError(fmt::format(
          "--rdzv {}: elastic.etcd_* TLS and user settings are for etcd over TLS: use etcds://", url));
    }
    std::vector<std::string> endpoints;
    for (const std::string& e : splitOn(rest, ',')) {
      const auto [host, port] = hostPort(e, url);
      endpoints.push_back(host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                                              : fmt::format("{}:{}", host, port));
    }
    if (endpoints.empty()) throw ConfigError(fmt::format("--rdzv {}: no etcd endpoint", url));
    return detail::connectEtcd(endpoints, tls, options);
  }
  if (scheme == "store") {
    const auto [host, port] = hostPort(rest, url);
    return detail::connectStoreKv(host, port, options);
  }
  throw ConfigError(fmt::format(
      "--rdzv {}: unknown rendezvous service (expected etcd://HOST:PORT[,HOST:PORT...]/JOB_ID, "
      "etcds://... (TLS) or store://HOST:PORT/JOB_ID)",
      url));
}

}  // namespace cohort::elastic
