#pragma once

// The key-value service elastic rendezvous runs on: etcd (v3 API) or
// cohort's own store. Rendezvous needs only these operations: read a key
// with its version, write it if nobody changed it since (compare-and-set),
// keep a key alive while this process is (etcd: a lease with keep-alive;
// the store: a heartbeat counter whose staleness readers measure on their
// own clock), and wait for a key to change.
//
// Every operation retries transient failures (a refused connection, an etcd
// member without a leader) with bounded backoff, moving to the next etcd
// endpoint, for at most KvOptions::retryFor; then it throws CommError naming
// the service and what failed. Nothing here includes LibTorch.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cohort::elastic {

struct Versioned {
  std::string value;
  int64_t version = 0;  // changes with every write; 0: the key is absent
};

struct KvOptions {
  std::chrono::milliseconds retryFor{30000};  // transient failures, per operation
  std::chrono::milliseconds aliveTtl{10000};  // a key kept alive lasts this long unrenewed
  // The store: its token (cohort/comm/store.h); etcd: unused.
  std::string storeToken;
  // etcds:// (etcd over TLS): the CA bundle that signs the members'
  // certificates (empty: the system's); a client certificate and key for
  // etcd's --client-cert-auth; an etcd user and password for etcd's own
  // authentication (a token from /v3/auth/authenticate on every request,
  // asked again when etcd says it expired). Secrets: never logged.
  std::string etcdCaFile, etcdCertFile, etcdKeyFile;
  std::string etcdUser, etcdPassword;
};

class Kv {
 public:
  virtual ~Kv() = default;

  // "etcd at 10.0.0.1:2379,10.0.0.2:2379", "cohort store at 10.0.0.1:29400".
  virtual std::string describe() const = 0;
  // Whether this process hosts the service (store:// only).
  virtual bool hosting() const { return false; }

  virtual std::optional<Versioned> get(const std::string& key) = 0;
  // Writes `value` when the key's version is still `version` (0: the key
  // must be absent). Returns whether it wrote.
  virtual bool compareAndSet(const std::string& key, int64_t version, const std::string& value) = 0;
  virtual void put(const std::string& key, const std::string& value) = 0;

  // Liveness. `key` holds `value` for as long as this process renews it
  // (a background thread renews every aliveTtl / 4); once renewals stop it
  // reads as not alive within aliveTtl. release() drops it at once.
  virtual void keepAlive(const std::string& key, const std::string& value) = 0;
  virtual void release() = 0;
  virtual bool alive(const std::string& key) = 0;

  // Waits until `key` changes from version `since`, at most `timeout`.
  // Returns true when it changed (or may have: callers read it again).
  virtual bool waitChange(const std::string& key, int64_t since, std::chrono::milliseconds timeout) = 0;
};

// Connects to a rendezvous service: "etcd://HOST:PORT[,HOST:PORT...]",
// "etcds://..." (the same over TLS) or "store://HOST:PORT" (a trailing
// "/JOB_ID" is the caller's to split off). Throws ConfigError for a
// malformed URL, and for TLS options or an etcd user on a plain etcd://.
std::unique_ptr<Kv> connectKv(const std::string& url, const KvOptions& options);

}  // namespace cohort::elastic
