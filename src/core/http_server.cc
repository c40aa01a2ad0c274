#include "core/detail/http_server.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <sys/socket.h>

#include "cohort/core/error.h"
#include "cohort/core/net.h"

namespace cohort::http {

void requireTokenBeyondLoopback(const std::string& what, const std::string& host, const std::string& token,
                                const std::string& howToSetOne) {
  if (!token.empty() || isLoopbackAddress(host)) return;
  throw ConfigError(fmt::format("{}: listening on {} (beyond this machine's loopback) needs a token: {}", what,
                                host, howToSetOne));
}

bool bearerMatches(const httplib::Request& req, const std::string& token) {
  const std::string expected = "Bearer " + token;
  const std::string given = req.get_header_value("Authorization");
  return given.size() == expected.size() && CRYPTO_memcmp(given.data(), expected.data(), given.size()) == 0;
}

std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

int bindHardened(httplib::Server& server, const std::string& what, const std::string& host, int port) {
  socket_t listening = -1;
  server.set_socket_options([&listening](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listening = sock;
  });
  int bound = -1;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    bound = port;
  }
  server.set_socket_options([](socket_t) {});
  if (bound <= 0) {
    throw CommError(fmt::format("{}: cannot listen on {}:{}: the port is in use, or the address is not one of "
                                "this machine's",
                                what, bracketed(host), port));
  }
  // A burst of clients beyond cpp-httplib's backlog of 5 saw connections
  // dropped; listening again on the bound socket raises it.
  if (listening >= 0) ::listen(listening, SOMAXCONN);
  return bound;
}

Listener::Listener(httplib::Server& server)
    : server_(server), thread_([this] {
        server_.listen_after_bind();
        returned_ = true;
      }) {}

bool Listener::waitRunning(std::chrono::milliseconds limit) const {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!server_.is_running() && !returned_.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return server_.is_running() && !returned_.load();
}

void Listener::stop() {
  if (!thread_.joinable()) return;
  // Server::stop() does nothing before the accept loop runs: wait until it
  // runs (it does at once) or has returned.
  while (!server_.is_running() && !returned_.load()) std::this_thread::yield();
  server_.stop();
  thread_.join();
}

}  // namespace cohort::http
