#pragma once

// What cohort's two HTTP servers (the /metrics endpoint, `cohort serve`)
// share on top of cpp-httplib: no open endpoint beyond loopback without a
// token, the bearer check in constant time, a bind that refuses a port in
// use, and the accept loop's thread, stopped and joined on every way out.

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace cohort::http {

// Throws ConfigError when `host` is beyond this machine's loopback and
// `token` is empty: "<what>: listening on <host> (beyond this machine's
// loopback) needs a token: <howToSetOne>".
void requireTokenBeyondLoopback(const std::string& what, const std::string& host, const std::string& token,
                                const std::string& howToSetOne);

// "Authorization: Bearer <token>", compared in constant time.
bool bearerMatches(const httplib::Request& req, const std::string& token);

// Binds `host`:`port` (0: a free port) with SO_REUSEADDR and without
// cpp-httplib's default SO_REUSEPORT, which would let a second server bind a
// port in use and take half its requests; raises the listen backlog from
// cpp-httplib's 5 to SOMAXCONN. Returns the port. Throws CommError
// naming `what` when the port is in use or the address is not this machine's.
// Replaces the server's socket options.
int bindHardened(httplib::Server& server, const std::string& what, const std::string& host, int port);

// "[::1]" for an IPv6 address, the host as it is otherwise.
std::string bracketed(const std::string& host);

// The accept loop's thread, started by the constructor on a bound server.
// The destructor stops the server and joins the thread, so an exception on
// the way out never leaves a joinable thread (std::terminate).
class Listener {
 public:
  explicit Listener(httplib::Server& server);
  ~Listener() { stop(); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Waits (at most `limit`) for the accept loop; true once it runs.
  bool waitRunning(std::chrono::milliseconds limit) const;
  // Stops the server and joins the thread; blocks until the workers have
  // answered what they hold. Idempotent.
  void stop();

 private:
  httplib::Server& server_;
  std::atomic<bool> returned_{false};
  std::thread thread_;  // last: started once the flag exists
};

}  // namespace cohort::http
