// The rendezvous store's table and server (cohort/comm/store.h).
//
// One thread accepts; each connection gets a thread that runs the
// handshake (bounded by handshakeTimeout), then serves one request at a
// time. A request that waits for a key blocks only its own connection.
// Stopping: the listening socket and every connection are shut down, which
// wakes their blocking reads, the table wakes every waiting request, and
// every thread is joined.

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <list>
#include <stdexcept>
#include <thread>

#include "cohort/comm/store.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/net.h"
#include "comm/detail/store_wire.h"

namespace cohort::comm {

// ---- KeyValueTable --------------------------------------------------------

template <class Ready>
bool KeyValueTable::waitFor(std::unique_lock<std::mutex>& lock, Millis timeout, Ready ready) {
  auto done = [&] { return stopped_ || ready(); };
  // A timeout of years overflows the clock's nanoseconds: longer than a
  // month is without limit (found by fuzzing a request's timeout field).
  if (timeout.count() < 0 || timeout > std::chrono::hours(24 * 30)) timeout = Millis(0);
  if (timeout.count() == 0) {
    changed_.wait(lock, done);
  } else if (!changed_.wait_for(lock, timeout, done)) {
    return false;
  }
  return ready();
}

void KeyValueTable::set(const std::string& key, std::string value) {
  {
    std::lock_guard<std::mutex> g(mutex_);
    values_[key] = std::move(value);
  }
  changed_.notify_all();
}

std::string KeyValueTable::compareSet(const std::string& key, const std::string& expected,
                                      std::string desired) {
  std::string now;
  {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) {
      if (!expected.empty()) return expected;
      it = values_.emplace(key, std::move(desired)).first;
    } else if (it->second == expected) {
      it->second = std::move(desired);
    }
    now = it->second;
  }
  changed_.notify_all();
  return now;
}

std::optional<std::string> KeyValueTable::get(const std::string& key, Millis timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!waitFor(lock, timeout, [&] { return values_.count(key) != 0; })) return std::nullopt;
  return values_[key];
}

int64_t KeyValueTable::add(const std::string& key, int64_t delta) {
  int64_t sum = 0;
  {
    std::lock_guard<std::mutex> g(mutex_);
    std::string& v = values_[key];
    int64_t old = 0;
    if (!v.empty()) {
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), old);
      if (ec != std::errc() || end != v.data() + v.size()) {
        throw std::invalid_argument(fmt::format("add: key '{}' holds no integer", key));
      }
    }
    sum = static_cast<int64_t>(static_cast<uint64_t>(old) + static_cast<uint64_t>(delta));
    v = std::to_string(sum);
  }
  changed_.notify_all();
  return sum;
}

bool KeyValueTable::erase(const std::string& key) {
  std::lock_guard<std::mutex> g(mutex_);
  return values_.erase(key) != 0;
}

bool KeyValueTable::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> g(mutex_);
  for (const auto& k : keys) {
    if (values_.count(k) == 0) return false;
  }
  return true;
}

int64_t KeyValueTable::size() {
  std::lock_guard<std::mutex> g(mutex_);
  return static_cast<int64_t>(values_.size());
}

bool KeyValueTable::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return waitFor(lock, timeout, [&] {
    for (const auto& k : keys) {
      if (values_.count(k) == 0) return false;
    }
    return true;
  });
}

void KeyValueTable::stop() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    stopped_ = true;
  }
  changed_.notify_all();
}

// ---- StoreServer ----------------------------------------------------------

std::string newStoreToken() {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) throw Error("no random bytes for a store token");
  std::string hex;
  for (unsigned char c : raw) hex += fmt::format("{:02x}", c);
  return hex;
}

namespace {

struct Connection {
  int fd = -1;
  std::string peer;
  std::thread thread;
  std::atomic<bool> done{false};
};

std::string peerName(const sockaddr_storage& a) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&a), sizeof a, host, sizeof host, port,
                sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
  return fmt::format("{}:{}", host, port);
}

// Binds and listens on exactly addr:port.
int listenOn(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int g = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (g != 0) {
    throw CommError(fmt::format("cannot host the rendezvous store on {}:{}: {}", addr, port,
                                ::gai_strerror(g)));
  }
  std::string last;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw CommError(fmt::format("cannot host the rendezvous store on {}:{}: {} (the address must "
                              "be one of this machine's)",
                              addr, port, last));
}

int boundPort(int fd) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

}  // namespace

struct StoreServer::Impl {
  StoreServerOptions options;
  KeyValueTable table;
  int listenFd = -1;
  int port = 0;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> refused{0};
  std::mutex connectionsMutex;
  std::list<Connection> connections;
  std::thread acceptor;

  void acceptLoop() {
    while (!stopping) {
      sockaddr_storage peer{};
      socklen_t n = sizeof peer;
      const int fd = ::accept4(listenFd, reinterpret_cast<sockaddr*>(&peer), &n, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // descriptors may free up
          continue;
        }
        return;  // shut down
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard<std::mutex> g(connectionsMutex);
      reapFinished();
      if (stopping) {
        ::close(fd);
        return;
      }
      Connection& c = connections.emplace_back();
      c.fd = fd;
      c.peer = peerName(peer);
      c.thread = std::thread([this, &c] {
        serveConnection(c);
        ::shutdown(c.fd, SHUT_RDWR);  // the peer sees the end now; closed when reaped
        c.done = true;
      });
    }
  }

  // With connectionsMutex held.
  void reapFinished() {
    for (auto it = connections.begin(); it != connections.end();) {
      if (it->done) {
        it->thread.join();
        ::close(it->fd);
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
  }

  void serveConnection(Connection& c) {
    try {
      const auto handshakeBy = detail::Clock::now() + options.handshakeTimeout;
      if (!detail::acceptHandshake(c.fd, options.token, handshakeBy)) {
        ++refused;
        log::warn("rendezvous store: refused {}: it does not hold the job's store token", c.peer);
        return;
      }
      while (!stopping) {
        auto request = detail::readMessage(c.fd, std::nullopt);
        if (!request) return;
        const detail::Message reply = detail::serve(table, *request);
        if (stopping) return;
        detail::sendAll(c.fd, detail::encode(reply), detail::Clock::now() + std::chrono::seconds(60));
      }
    } catch (const std::exception& e) {
      if (!stopping) log::debug("rendezvous store: connection from {} ended: {}", c.peer, e.what());
    }
  }
};

StoreServer::StoreServer(const StoreServerOptions& options) : impl_(std::make_unique<Impl>()) {
  if (!isLoopbackAddress(options.addr) && options.token.empty()) {
    throw ConfigError(fmt::format(
        "the rendezvous store would listen on {}, beyond loopback, without a store token: set "
        "COHORT_STORE_TOKEN or distribution.store_token_file (the same on every machine; "
        "docs/security.md)",
        options.addr));
  }
  impl_->options = options;
  impl_->listenFd = listenOn(options.addr, options.port);
  impl_->port = boundPort(impl_->listenFd);
  impl_->acceptor = std::thread([this] { impl_->acceptLoop(); });
}

StoreServer::~StoreServer() {
  impl_->stopping = true;
  ::shutdown(impl_->listenFd, SHUT_RDWR);
  impl_->table.stop();
  impl_->acceptor.join();
  ::close(impl_->listenFd);
  std::lock_guard<std::mutex> g(impl_->connectionsMutex);
  for (auto& c : impl_->connections) ::shutdown(c.fd, SHUT_RDWR);
  for (auto& c : impl_->connections) {
    c.thread.join();
    ::close(c.fd);
  }
}

int StoreServer::port() const { return impl_->port; }
KeyValueTable& StoreServer::table() { return impl_->table; }
int64_t StoreServer::refused() const { return impl_->refused; }

}  // namespace cohort::comm
