#include "cohort/core/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cohort/core/error.h"
#include "cohort/core/fd.h"

namespace cohort {

bool isLoopbackAddress(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

std::optional<std::string> localAddressTowards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port > 0 ? port : 9);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0) return std::nullopt;
  std::optional<std::string> out;
  for (addrinfo* a = found; a != nullptr && !out; a = a->ai_next) {
    // A datagram socket's connect() only picks the route and the source address.
    UniqueFd fd(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid() || ::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = local.ss_family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
    if (::inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) out = text;
  }
  ::freeaddrinfo(found);
  return out;
}

int freeTcpPort() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = 0;
  socklen_t len = sizeof any;
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&any), sizeof any) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&any), &len) != 0) {
    throw IoError("cannot find a free TCP port: no socket could be bound");
  }
  return ntohs(any.sin_port);
}

std::string hostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "unknown";
  return host;
}

}  // namespace cohort
