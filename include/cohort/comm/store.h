#pragma once

// cohort's rendezvous store: a key-value table served over TCP to the ranks
// of a job, in the role c10d's TCPStore plays for torchrun.
//
// Why not TCPStore: it listens on every interface whatever address it is
// given, and anyone who reaches its port may read and write every key (it
// has no authentication). cohort's store binds exactly the address it is
// given (loopback by default), and every connection must prove it holds the
// job's store token before its first request (docs/security.md). Binding
// beyond loopback without a token is refused.
//
// The table and the server include no LibTorch; comm.h adapts them to
// c10d::Store for Gloo.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace cohort::comm {

// Keys to byte strings, safe to use from many threads, with reads that
// wait for a key to appear. A timeout of zero waits without limit (c10d's
// kNoTimeout). After stop(), every waiting call returns at once as if it
// had timed out.
class KeyValueTable {
 public:
  using Millis = std::chrono::milliseconds;

  void set(const std::string& key, std::string value);
  // As c10d's compareSet: an absent key with an empty `expected` takes
  // `desired`; a present key equal to `expected` takes `desired`. Returns the
  // key's value afterwards (`expected` when the key stays absent).
  std::string compareSet(const std::string& key, const std::string& expected, std::string desired);
  // The value of `key` once it exists; nullopt after `timeout`.
  std::optional<std::string> get(const std::string& key, Millis timeout);
  // Adds `delta` to the decimal integer held at `key` (absent: 0) and returns
  // the sum. Throws std::invalid_argument when the value is not an integer.
  int64_t add(const std::string& key, int64_t delta);
  bool erase(const std::string& key);
  bool check(const std::vector<std::string>& keys);
  int64_t size();
  // True once every key exists; false after `timeout`.
  bool wait(const std::vector<std::string>& keys, Millis timeout);
  void stop();

 private:
  template <class Ready>
  bool waitFor(std::unique_lock<std::mutex>& lock, Millis timeout, Ready ready);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
  bool stopped_ = false;
};

struct StoreServerOptions {
  std::string addr = "127.0.0.1";  // bound exactly: a host name, IPv4 or IPv6 address
  int port = 0;                    // 0: a free port
  // The job's store token; clients must prove they hold it. Empty: none is
  // asked for, allowed on loopback addresses only.
  std::string token;
  // A client that has not finished the handshake by then is dropped.
  std::chrono::milliseconds handshakeTimeout{10000};
};

// Serves a KeyValueTable on one address. Each connection has a thread; the
// destructor closes them all, wakes waiting requests and joins.
class StoreServer {
 public:
  // Throws ConfigError when a non-loopback address comes without a token,
  // CommError when the address cannot be bound.
  explicit StoreServer(const StoreServerOptions& options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  // The table itself, for the process hosting the store.
  KeyValueTable& table();
  // Connections refused at the handshake so far (a wrong or missing token).
  int64_t refused() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A fresh random token (64 hex digits) for a job whose launcher hosts the store.
std::string newStoreToken();

}  // namespace cohort::comm
