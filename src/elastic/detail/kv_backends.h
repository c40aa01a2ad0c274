#pragma once

// The two rendezvous services behind connectKv (cohort/elastic/kv.h).

#include <memory>
#include <string>
#include <vector>

#include "cohort/elastic/kv.h"

namespace cohort::elastic::detail {

// etcd's v3 JSON API at each "host:port" (the members of one cluster),
// over https when `tls`.
std::unique_ptr<Kv> connectEtcd(const std::vector<std::string>& endpoints, bool tls, const KvOptions& options);

// cohort's store at host:port: hosted here (the first agent there) when the
// address can be bound, else reached as a client.
std::unique_ptr<Kv> connectStoreKv(const std::string& host, int port, const KvOptions& options);

}  // namespace cohort::elastic::detail
