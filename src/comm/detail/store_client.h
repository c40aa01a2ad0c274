#pragma once

// cohort's rendezvous store (cohort/comm/store.h) as a c10d::Store, for
// Gloo and for cohort's own keys.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "cohort/comm/store.h"

namespace cohort::comm::detail {

// A client connection to the store at host:port, proving it holds `token`.
// Connecting retries until `timeout` (the server may not be up yet).
// Throws CommError naming the address, or ConfigError for a token problem.
c10::intrusive_ptr<c10d::Store> connectStore(const std::string& host, int port,
                                             const std::string& token,
                                             std::chrono::milliseconds timeout);

// Hosts the store in this process; the returned c10d::Store reads and writes
// its table directly and keeps the server alive.
struct HostedStoreHandle {
  c10::intrusive_ptr<c10d::Store> store;
  int port = 0;
};
HostedStoreHandle hostStoreServer(const StoreServerOptions& options,
                                  std::chrono::milliseconds timeout);

}  // namespace cohort::comm::detail
