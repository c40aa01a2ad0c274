#pragma once

// How a DDP's gradient buckets travel, decided once by all ranks together
// (ddp.cc holds the buckets and runs the exchange; this sets it up).
//
// Every rank publishes its machine identity (host name and boot id, or
// COHORT_MACHINE_ID) in the store, and every rank groups the ranks the same
// way: machines are numbered by their lowest rank, which is their leader.
//   one machine                 -> shared memory among all ranks
//   several, one rank on each   -> Gloo among all ranks
//   several, some with >= 2     -> hierarchical: a shared memory segment per
//                                  machine with >= 2 ranks, and a Gloo group
//                                  of the leaders (rank in it = machine index)
// Whatever fails on any rank (a segment, the leaders' group), every rank
// learns it through one allreduce on the job's group and falls back to Gloo
// among all ranks, so all take the same path.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/comm.h"
#include "cohort/parallel/ddp.h"

namespace cohort::comm {
class ShmAllreduce;
}

namespace cohort::parallel::detail {

struct ExchangePlan {
  Exchange exchange = Exchange::none;
  int machines = 1;
  int machine = 0;             // this rank's machine
  std::vector<int> local;      // the ranks on this rank's machine, ascending
  bool leader = true;          // this rank is local[0]
  // Among the ranks of this machine (index in it = position in `local`);
  // null when alone or under Gloo among all ranks.
  std::shared_ptr<comm::ShmAllreduce> shm;
  // Hierarchical, leaders only: one rank per machine.
  c10::intrusive_ptr<c10d::ProcessGroup> across;
};

// Collective: every rank calls it once per DDP, in the same order. With
// `sharedMemory` false (not asked for, or gradients not float32 on the CPU:
// `why` says which) the plan is Gloo among all ranks. `totalFloats` is the
// size of a rank's gradients. Logs the path chosen ("gradient exchange:
// ..."). Throws CommError/TimeoutError when the store or the agreement
// fails. `acrossMachines` false (ZeRO stages 2 and 3, whose reduce-scatter
// has no hierarchical form): ranks on several machines exchange over Gloo
// among all ranks, and no segment is made for them.
// `what` names the exchange in the log lines.
ExchangePlan planExchange(const comm::Comm& comm, bool sharedMemory, const std::string& why,
                          int64_t totalFloats, bool acrossMachines = true,
                          const std::string& what = "gradient exchange");

}  // namespace cohort::parallel::detail
