// HTTP requests to cohort's /metrics endpoint (src/monitor/prometheus.cc):
// a MetricsServer on a loopback port, as a run starts it, gets each input as
// the bytes of one connection.
//
// Input: what a client sends, after which the client closes its sending
// half, so that an incomplete request ends at once instead of after the
// server's 1 s read timeout. The server must close the connection (within
// libFuzzer's -timeout; 30 s when replaying), with an HTTP response or none
// (cpp-httplib does not answer a client that has half-closed), and keep
// serving: a scrape after every input must get the exposition.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <memory>

#include "cohort/monitor/prometheus.h"
#include "fuzz_util.h"

namespace {

using cohort::fuzz::finding;
using cohort::fuzz::require;

std::string exposition() {
  return cohort::monitor::PrometheusText()
      .gauge("cohort_step", "Optimizer steps completed.", 42, {{"job", "fuzz"}})
      .str();
}

cohort::monitor::MetricsServer& server() {
  static auto* s = [] {
    auto* m = new cohort::monitor::MetricsServer({"127.0.0.1", 0}, exposition);
    m->start();
    return m;
  }();
  return *s;
}

// Sends `request`, ends the connection's sending half if `halfClose`,
// returns all the server sends back until it closes.
// A connection to the endpoint. The client side, not the server, may run
// short: libFuzzer's SIGALRM interrupts connect(), and a thousand
// connections a second can exhaust the loopback's ephemeral ports for a
// moment (EADDRNOTAVAIL); both are retried, a bounded number of times.
int connectToServer() {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server().port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int err = 0;
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    require(fd >= 0, "socket() failed");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    err = errno;
    ::close(fd);
    if (err != EINTR && err != EADDRNOTAVAIL && err != EAGAIN) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(attempt < 10 ? 1 : 20));
  }
  finding(std::string("cannot connect to the metrics endpoint: ") + std::strerror(err));
  return -1;
}

std::string exchange(const std::string& request, bool halfClose) {
  const int fd = connectToServer();
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;  // libFuzzer's SIGALRM (-timeout) interrupts calls
    if (n <= 0) break;  // the server may close early on a bad request
    sent += static_cast<size_t>(n);
  }
  if (halfClose) ::shutdown(fd, SHUT_WR);
  std::string response;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    require(ready > 0, "the metrics endpoint neither answered nor closed within 30 s");
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  // Reset rather than close: thousands of connections a second would
  // otherwise use up the loopback ports in TIME_WAIT.
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  ::close(fd);
  return response;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string response = exchange(cohort::fuzz::asString(data, size), true);
  require(response.empty() || response.rfind("HTTP/1.1 ", 0) == 0,
          "a response that is not HTTP: " + response.substr(0, 200));
  require(response.find("HTTP/1.1 500") == std::string::npos, "a 500 answer: " + response.substr(0, 200));
  const std::string scrape = exchange("GET /metrics HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n", false);
  require(scrape.rfind("HTTP/1.1 200", 0) == 0 && scrape.find(exposition()) != std::string::npos,
          "the endpoint stopped serving /metrics after that input: " + scrape.substr(0, 200));
  return 0;
}
