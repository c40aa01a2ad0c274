#include "cohort/core/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <utility>

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

namespace {

// Binds an IPv4 stream socket to `port` on every address (0: the kernel
// picks) and returns the port it holds, or 0 when the bind fails. The socket
// is closed on return; without SO_REUSEADDR a port that a connection still
// holds in TIME_WAIT counts as taken.
int tryBind(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof any;
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&any), sizeof any) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&any), &len) != 0) {
    return 0;
  }
  return ntohs(any.sin_port);
}

// The kernel's ephemeral range (net.ipv4.ip_local_port_range), Linux's
// default when it cannot be read.
std::pair<int, int> ephemeralRange() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (in >> low >> high && 0 < low && low <= high && high < 65536) return {low, high};
  return {32768, 60999};
}

}  // namespace

int freeTcpPort() {
  // A port from the ephemeral range can be taken between this call and the
  // server's bind by any connection this machine opens (its local port) or by
  // any other program asking the kernel for a port. So the port comes from
  // the half of the range below the ephemeral ones, at random, and is checked
  // free by binding it; only if none of those is free does the kernel pick.
  const auto [low, high] = ephemeralRange();
  const int from = std::max(1024, low / 2), to = low - 1;
  if (to - from >= 64) {
    std::mt19937 pick(std::random_device{}());
    std::uniform_int_distribution<int> port(from, to);
    for (int attempt = 0; attempt < 64; ++attempt) {
      if (const int p = tryBind(port(pick)); p > 0) return p;
    }
  }
  const int p = tryBind(0);
  if (p == 0) throw IoError("cannot find a free TCP port: no socket could be bound");
  return p;
}

std::string hostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "unknown";
  return host;
}

}  // namespace cohort
