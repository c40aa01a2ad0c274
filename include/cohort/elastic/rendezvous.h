#pragma once

// Elastic rendezvous: which nodes (agents) form the job now. One record,
// <prefix>/state, versioned and changed only by compare-and-set:
//
//   {"round": R, "status": "open" | "frozen" | "closed",
//    "members": [node ids], "addrs": {node id: address},
//    "waiting": [node ids], "known": [node ids], "job_hash": ...,
//    "exit_code": ...}
//
// A round opens with no members. Agents add themselves (at most MAX). Once
// MIN are in, a last-call window lets more arrive; when it has passed (or
// MAX are in, or, in a re-form, every live node the job has known is back)
// any member freezes the round. The members sorted by node id
// are the node ranks: the same on every node, whoever froze it. A node that
// arrives while a round is frozen adds itself to "waiting"; the members see
// it and re-form at their next step boundary by opening round R+1. A member
// whose liveness key (<prefix>/alive/<node>: an etcd lease, kept alive by
// its agent) vanishes makes the others open round R+1 at once. When the job
// ends, a member closes the record; agents arriving later see it closed.
//
// Every wait is bounded: waits on the record are cut into slices of
// `poll`, so timers (last call, below MIN) are checked in between.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cohort/elastic/kv.h"

namespace cohort::elastic {

struct RendezvousOptions {
  std::string prefix;   // "/cohort/<job id>"
  std::string jobId;
  std::string nodeId;   // unique per agent
  std::string address;  // where the other nodes reach this one
  std::string jobHash;  // of the resolved job file: every node must agree
  int minNodes = 1;
  int maxNodes = 1;
  std::chrono::milliseconds lastCall{3000};
  // Open with fewer than MIN members for this long: join() gives up
  // (Outcome::belowMin). 0: wait without limit.
  std::chrono::milliseconds belowMinFor{0};
  std::chrono::milliseconds poll{250};
  // Asked between waits: true makes join() return Status::interrupted.
  std::function<bool()> interrupted;
  // Told of the members of a round that are no longer alive, whenever
  // check() or join() finds them (more than once, possibly), with the
  // newest round their ranks may run in: the agent fences them out of the
  // run (cohort/core/fence.h). May throw.
  std::function<void(const std::vector<std::string>& nodes, int64_t round)> lost;
};

struct Round {
  enum class Status { frozen, closed, belowMin, interrupted };
  Status status = Status::frozen;
  int64_t round = 0;
  std::vector<std::string> members;           // sorted: node rank = index
  std::map<std::string, std::string> addrs;   // node id -> address
  int nodeRank = -1;                          // this node's
  int exitCode = 0;                           // closed: how the job ended
};

// What changed since a round was frozen (Rendezvous::check).
struct Change {
  enum class Kind { none, waiting, lost, reformed, closed };
  Kind kind = Kind::none;
  std::string detail;  // which nodes; closed: the exit code
  std::vector<std::string> nodes;  // lost: which
};

class Rendezvous {
 public:
  Rendezvous(Kv& kv, RendezvousOptions options);

  // Takes part in rounds until one is frozen with this node in it, the job
  // is closed, or (belowMinFor) too few nodes came. Throws ConfigError when
  // the job id is in use by a job with another job file, CommError when
  // the service stays unreachable.
  Round join();

  // While `r` runs: a node waiting to join, a member no longer alive, a
  // newer round opened by another member, or the job closed.
  Change check(const Round& r);

  // Opens round r.round + 1 unless another member already did.
  void openNext(const Round& r, const std::string& why);

  // Marks the job ended with `exitCode` (0: completed).
  void close(int exitCode);

  // Node 0 of round r publishes where the round's store listens; the others
  // wait for it (at most `timeout`; nullopt when the round moved on or the
  // time passed).
  void publishStore(int64_t round, const std::string& hostPort);
  std::optional<std::string> waitStore(const Round& r, std::chrono::milliseconds timeout);

  const RendezvousOptions& options() const { return o_; }

 private:
  Kv& kv_;
  RendezvousOptions o_;
  std::string stateKey_;
};

// The liveness key of `node` under `prefix`.
std::string aliveKey(const std::string& prefix, const std::string& node);

}  // namespace cohort::elastic
