#include "cohort/comm/comm.h"

#include <fmt/format.h>
#include <net/if.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <unistd.h>

#include <cstdio>
#include <map>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/comm/wait.h"
#include "cohort/core/log.h"
#include "cohort/core/net.h"
#include "cohort/core/text.h"
#include "comm/detail/store_client.h"

namespace cohort::comm {
namespace {

std::string message(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

bool timedOut(const std::string& m) {
  return m.find("imed out") != std::string::npos || m.find("imeout") != std::string::npos;
}

// Gloo's options: `connections` devices on the interface (or address) the
// collectives use.
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> glooOptions(const std::string& interface,
                                                                const std::string& masterAddr,
                                                                int connections,
                                                                std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  for (int k = 0; k < std::max(1, connections); ++k) {
    if (!interface.empty() && if_nametoindex(interface.c_str()) != 0) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    } else if (!interface.empty()) {
      // Not an interface of this machine: an address or host name to bind to.
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(interface));
    } else if (isLoopbackAddress(masterAddr)) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else if (const auto local = localAddressTowards(masterAddr, 0); local && !isLoopbackAddress(*local)) {
      // The address this machine reaches rank 0's store from: the network
      // the job's machines share, whatever the host name resolves to.
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(*local));
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
  }
  // Two collectives at a time at least (a bucket's allreduce runs while the
  // next one starts), and one per set of connections.
  opts->threads = std::max(2, connections);
  return opts;
}

std::string stringOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

HostedStore hostStore(const std::string& addr, int port, std::chrono::milliseconds timeout,
                      const std::string& token) {
  StoreServerOptions so;
  so.addr = addr;
  so.port = port;
  so.token = token;
  auto hosted = detail::hostStoreServer(so, timeout);
  return HostedStore{hosted.store, hosted.port};
}

c10::intrusive_ptr<c10d::Store> connectStoreClient(const std::string& host, int port,
                                                   const std::string& token,
                                                   std::chrono::milliseconds timeout) {
  return detail::connectStore(host, port, token, timeout);
}

Comm connect(const CommOptions& o) {
  Comm c;
  static_cast<RankPlace&>(c) = o;
  c.timeout = o.timeout;
  c.storePrefix = o.storePrefix;
  c.interface = o.interface;
  c.glooConnections = o.glooConnections;
  const std::string where = fmt::format("{}:{}", o.masterAddr, o.masterPort);
  c.storeToken = o.storeToken;
  try {
    auto base = o.hostStore ? hostStore(o.masterAddr, o.masterPort, o.timeout, o.storeToken).store
                            : detail::connectStore(o.masterAddr, o.masterPort, o.storeToken,
                                                   o.timeout);
    c.store = c10::make_intrusive<c10d::PrefixStore>(o.storePrefix, base);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("rank {}: {}", o.rank, e.what()));
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: cannot {} the rendezvous store at {}: {}", o.rank,
                                o.hostStore ? "host" : "reach", where, message(e)));
  }

  if (o.backend == "nccl") {
#ifdef USE_C10D_NCCL
    // CUDA builds only. Untested: cohort's development machines have no GPU.
    if (!torch::cuda::is_available()) {
      throw CommError(fmt::format("rank {}: backend nccl needs a CUDA device", o.rank));
    }
    c.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(
                                           o.localRank % torch::cuda::device_count()));
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = o.timeout;
    auto pgStore = c10::make_intrusive<c10d::PrefixStore>("pg", c.store);
    c.pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(pgStore, o.rank, o.worldSize, opts);
    return c;
#else
    throw CommError("backend nccl is not available in this build (cmake -DCOHORT_WITH_CUDA=ON)");
#endif
  }
  if (o.backend != "gloo") {
    throw CommError(fmt::format("backend '{}' is not available in this build", o.backend));
  }
  try {
    auto opts = glooOptions(o.interface, o.masterAddr, o.glooConnections, o.timeout);
    auto pgStore = c10::make_intrusive<c10d::PrefixStore>("pg", c.store);
    c.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(pgStore, o.rank, o.worldSize, opts);
  } catch (const std::exception& e) {
    std::string m = message(e);
    if (timedOut(m)) {
      throw TimeoutError(fmt::format(
          "rank {}: not every one of the {} ranks joined within {} s (store {}): {}", o.rank,
          o.worldSize, o.timeout.count() / 1000.0, where, m));
    }
    throw CommError(fmt::format("rank {}: cannot build the process group (store {}{}): {}", o.rank,
                                where,
                                o.interface.empty() ? "" : ", distribution.interface " + o.interface,
                                m));
  }
  return c;
}

c10::intrusive_ptr<c10d::ProcessGroup> newGroup(const Comm& comm, const std::string& name, int rank,
                                                int size) {
  try {
    auto opts = glooOptions(comm.interface, comm.masterAddr, comm.glooConnections, comm.timeout);
    auto store = c10::make_intrusive<c10d::PrefixStore>("group/" + name, comm.store);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
  } catch (const std::exception& e) {
    const std::string m = message(e);
    if (timedOut(m)) {
      throw TimeoutError(fmt::format("rank {}: not every one of the {} members of group {} joined "
                                     "within {} s: {}",
                                     comm.rank, size, name, comm.timeout.count() / 1000.0, m));
    }
    throw CommError(fmt::format("rank {}: cannot build the process group {}: {}", comm.rank, name, m));
  }
}

std::string machineIdentity(int jobRank) {
  if (auto id = env::machineId(jobRank)) return "id:" + *id;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) boot = buf;
    std::fclose(f);
  }
  return std::string(host) + "/" + boot;
}

Comm subgroup(const Comm& world, const std::string& name, const std::vector<int>& members) {
  const auto at = std::find(members.begin(), members.end(), world.rank);
  COHORT_ASSERT(at != members.end(), "rank ", world.rank, " forms group ", name, " without being in it");
  Comm c = world;
  c.rank = static_cast<int>(at - members.begin());
  c.worldSize = static_cast<int>(members.size());
  c.jobRanks.clear();
  for (int m : members) c.jobRanks.push_back(world.jobRank(m));
  c.pg = newGroup(world, name, c.rank, c.worldSize);
  const std::string keys = "group/" + name + "/kv";
  c.store = c10::make_intrusive<c10d::PrefixStore>(keys, world.store);
  c.storePrefix = world.storePrefix + "/" + keys;
  return c;
}

c10::intrusive_ptr<c10d::Store> openStoreClient(const Comm& comm) {
  try {
    auto base = detail::connectStore(comm.masterAddr, comm.masterPort, comm.storeToken, comm.timeout);
    return c10::make_intrusive<c10d::PrefixStore>(comm.storePrefix, base);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: cannot reach the rendezvous store at {}:{}: {}",
                                comm.rank, comm.masterAddr, comm.masterPort, message(e)));
  }
}

void wait(const c10::intrusive_ptr<c10d::Work>& work, const Comm& comm, const char* what) {
  CollectiveWait waiting(what);  // for the stall inspector (monitor/watchdog.h)
  try {
    work->wait(comm.timeout);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: {} failed (a peer may have died): {}", comm.rank, what,
                                message(e)));
  }
}

void allreduceSum(const Comm& comm, at::Tensor& t, const char* what) {
  if (comm.worldSize == 1) return;
  // Small host-side values (metrics) travel on the backend's device.
  std::vector<at::Tensor> v{t.device() == comm.device ? t : t.to(comm.device)};
  wait(comm.pg->allreduce(v), comm, what);
  if (!v[0].is_same(t)) t.copy_(v[0]);
}

void broadcast(const Comm& comm, std::vector<at::Tensor>& tensors, int root, const char* what) {
  if (comm.worldSize == 1 || tensors.empty()) return;
  std::map<at::ScalarType, std::vector<at::Tensor*>> byType;
  for (auto& t : tensors) byType[t.scalar_type()].push_back(&t);
  for (auto& [type, group] : byType) {
    std::vector<at::Tensor> flat;
    for (auto* t : group) flat.push_back(t->detach().reshape({-1}));
    std::vector<at::Tensor> packed{torch::cat(flat)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    wait(comm.pg->broadcast(packed, opts), comm, what);
    torch::NoGradGuard g;
    int64_t offset = 0;
    for (auto* t : group) {
      const int64_t n = t->numel();
      t->copy_(packed[0].narrow(0, offset, n).view_as(*t));
      offset += n;
    }
  }
}

void barrier(const Comm& comm, const char* what) {
  if (comm.worldSize == 1) return;
  wait(comm.pg->barrier(), comm, what);
}

std::vector<std::string> allGather(const Comm& comm, const std::string& key, const std::string& value) {
  if (comm.worldSize == 1) return {value};
  comm.store->set(fmt::format("gather/{}/{}", key, comm.rank), bytesOf(value));
  std::vector<std::string> all;
  for (int r = 0; r < comm.worldSize; ++r) {
    const std::string k = fmt::format("gather/{}/{}", key, r);
    try {
      CollectiveWait waiting(key.c_str());
      comm.store->wait({k}, comm.timeout);
      all.push_back(stringOf(comm.store->get(k)));
    } catch (const std::exception& e) {
      throw TimeoutError(fmt::format("rank {}: rank {} did not report its {} within {} s: {}",
                                     comm.rank, r, key, comm.timeout.count() / 1000.0, message(e)));
    }
  }
  return all;
}

void checkAgreement(const Comm& comm, const std::string& key, const std::string& value) {
  if (comm.worldSize == 1) return;
  std::map<std::string, std::vector<int>> byValue;
  const auto all = allGather(comm, key, value);
  for (int r = 0; r < comm.worldSize; ++r) byValue[all[static_cast<size_t>(r)]].push_back(r);
  if (byValue.size() == 1) return;
  std::vector<std::string> parts;
  for (const auto& [v, ranks] : byValue) {
    parts.push_back(fmt::format("ranks [{}] have {}", fmt::join(ranks, ", "), v));
  }
  throw ConfigError(fmt::format("the ranks disagree on the {}: {}", key, fmt::join(parts, "; ")));
}

std::string shareFromRoot(const Comm& comm, const std::string& key, const std::string& value,
                          int root) {
  if (comm.worldSize == 1) return value;
  const std::string k = "share/" + key;
  if (comm.rank == root) {
    comm.store->set(k, bytesOf(value));
    return value;
  }
  try {
    CollectiveWait waiting("a value from rank 0");
    comm.store->wait({k}, comm.timeout);
    return stringOf(comm.store->get(k));
  } catch (const std::exception& e) {
    throw TimeoutError(fmt::format("rank {}: rank {} did not publish {} within {} s: {}", comm.rank,
                                   root, key, comm.timeout.count() / 1000.0, message(e)));
  }
}

}  // namespace cohort::comm
