#pragma once

// Rendezvous and the process group: cohort's rendezvous store
// (cohort/comm/store.h, hosted by the launcher or by rank 0) and a c10d
// ProcessGroupGloo over TCP. Collectives come from c10d; cohort adds
// timeouts and error messages that name the rank.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "cohort/comm/store.h"
#include "cohort/core/rank_place.h"

namespace cohort::comm {

// Where the rank sits (RankPlace: rank, world, local rank, the store's
// address), and how to connect.
struct CommOptions : RankPlace {
  bool hostStore = false;  // this process hosts the store's server
  // The job's store token (storeToken() in config/job.h): every connection
  // proves it holds it. Empty: none, allowed when the store is on loopback.
  std::string storeToken;
  std::string backend = "gloo";  // gloo | nccl (CUDA builds only; untested)
  std::string interface;   // gloo: interface name or local address; empty: from masterAddr
  std::chrono::milliseconds timeout{300000};
  // Namespace of this run's keys in the store: a restarted job uses a fresh
  // one, so keys of the failed attempt are never read.
  std::string storePrefix = "cohort";
  // gloo: sets of connections between every pair of ranks (one Gloo device
  // each). c10d gives successive collectives to successive sets, round
  // robin, so up to this many bucket allreduces travel on separate sockets;
  // the group runs max(2, glooConnections) collectives at a time.
  int glooConnections = 1;
};

// A connected rank: its place (masterAddr:masterPort is the store it
// reached), its process group and store.
struct Comm : RankPlace {
  // Where this rank's tensors live: CPU for gloo, cuda:<local rank> for nccl.
  c10::Device device = c10::kCPU;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::chrono::milliseconds timeout{300000};
  std::string storePrefix;
  std::string storeToken;
  // How the process group's Gloo devices were made, for groups made later
  // (newGroup).
  std::string interface;
  int glooConnections = 1;
  // A group of some of the job's ranks (subgroup): the job rank of each of
  // its members, by rank in the group. Empty: the group is the whole job.
  // rank and worldSize are the group's; the local* fields stay the job's.
  std::vector<int> jobRanks;
  int jobRank(int groupRank) const {
    return jobRanks.empty() ? groupRank : jobRanks[static_cast<size_t>(groupRank)];
  }
};

// A rendezvous store hosted by a launcher for its ranks.
struct HostedStore {
  c10::intrusive_ptr<c10d::Store> store;
  int port = 0;  // the port it listens on (the free port picked when asked for 0)
};

// Hosts the store on exactly addr:port (0: a free port), asking every
// connection for `token`; operations use `timeout`. Throws CommError naming
// the address, or ConfigError for a non-loopback address without a token.
HostedStore hostStore(const std::string& addr, int port, std::chrono::milliseconds timeout,
                      const std::string& token);

// A client of the store at host:port, proving it holds `token`; connecting
// retries until `timeout`. Throws CommError naming the address, or
// ConfigError for a token the store refuses.
c10::intrusive_ptr<c10d::Store> connectStoreClient(const std::string& host, int port,
                                                   const std::string& token,
                                                   std::chrono::milliseconds timeout);

// Connects to (or hosts) the store and builds the process group. Blocks
// until every rank has joined or the timeout passes. Throws CommError or
// TimeoutError naming the store address.
Comm connect(const CommOptions& options);

// A further Gloo process group among some of the ranks, on comm's store
// under `name` (unique in the job), with devices made as comm's: this rank
// is `rank` of `size` in it. Only its members call it, and each blocks until
// all of them have (comm.timeout). Throws CommError, or TimeoutError, naming
// the group and this rank.
c10::intrusive_ptr<c10d::ProcessGroup> newGroup(const Comm& comm, const std::string& name, int rank,
                                                int size);

// A Comm over some ranks of `world`: `members` are their job ranks,
// ascending, this rank among them. Its own Gloo process group (newGroup
// under `name`, unique in the job), its rank and size in the group, and its
// store keys under the group's name (openStoreClient reaches the same
// namespace). Only the members call it; each blocks until all of them have
// (world.timeout). Throws CommError or TimeoutError naming the group.
Comm subgroup(const Comm& world, const std::string& name, const std::vector<int>& members);

// A second connection to the rendezvous store, in the same namespace, for a
// background thread: store operations on one connection are serialized, so a
// thread blocked on its own connection does not block the training thread.
c10::intrusive_ptr<c10d::Store> openStoreClient(const Comm& comm);

// The identity of the machine job rank `jobRank` runs on (this process):
// COHORT_MACHINE_ID (tests form several machines on one host with it; a
// list gives one per rank), or the host name and boot id. Ranks that share
// memory share it.
std::string machineIdentity(int jobRank);

// Waits for a collective and turns a c10d failure into CommError naming the
// operation and this rank.
void wait(const c10::intrusive_ptr<c10d::Work>& work, const Comm& comm, const char* what);

// In-place sum across ranks.
void allreduceSum(const Comm& comm, at::Tensor& t, const char* what);
// Every tensor takes rank `root`'s values. Tensors of one dtype are packed
// into one message.
void broadcast(const Comm& comm, std::vector<at::Tensor>& tensors, int root, const char* what);
void barrier(const Comm& comm, const char* what);

// Every rank's `value` for `key`, in rank order (through the store; `key`
// is used once per job, or with the same values). Throws TimeoutError
// naming a rank that did not report within the timeout.
std::vector<std::string> allGather(const Comm& comm, const std::string& key, const std::string& value);

// Checks that every rank holds the same `value` for `key` (through the
// store). On disagreement every rank throws the same ConfigError, naming the
// ranks and their values.
void checkAgreement(const Comm& comm, const std::string& key, const std::string& value);

// Rank `root` publishes `value` under `key`; every rank returns it.
std::string shareFromRoot(const Comm& comm, const std::string& key, const std::string& value,
                          int root = 0);

}  // namespace cohort::comm
