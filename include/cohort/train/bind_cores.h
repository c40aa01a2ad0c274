#pragma once

// Which cores a rank's threads run on (compute.bind_cores). When the ranks
// of a machine and their intra-op threads fill its cores, each rank is held
// to cores of its own, as PyTorch's CPU launcher (torch.backends.xeon.run_cpu,
// through numactl) and DeepSpeed's --bind_cores_to_rank do: left to the
// scheduler, two ranks' threads meet on one core now and then, that rank's
// step runs late, and in synchronous training every other rank waits for it.

#include <string>
#include <vector>

#include "cohort/config/choices.h"

namespace cohort::train {

// The cores this process may run on (sched_getaffinity), ascending.
std::vector<int> allowedCores();

// The cores of local rank `localRank` of `localRanks`, each with `threads`
// intra-op threads, out of `allowed`: consecutive slices of `threads`, in
// order. Empty when the rank is not to be bound: `off`; `auto` unless the
// ranks' threads number exactly the allowed cores. Throws ConfigError for
// `on` when they need more cores than there are.
std::vector<int> coresOfRank(BindCores mode, const std::vector<int>& allowed, int localRank, int localRanks,
                             int threads);

// Holds every thread of this process (and those it starts later) to
// `cores`; throws Error naming the call that failed.
void bindProcess(const std::vector<int>& cores);

// "0-3,6" for {0, 1, 2, 3, 6}.
std::string describeCores(const std::vector<int>& cores);

}  // namespace cohort::train
