#pragma once

// Where a rank sits in a job: what every launcher tells its ranks (torchrun's
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
// Read from the environment (env::RankEnv), handed to comm::connect
// (comm::CommOptions) and kept by the connected comm::Comm: one definition
// for all three.

#include <string>

namespace cohort {

struct RankPlace {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;       // among the ranks of this machine
  int localWorldSize = 1;  // ranks on this machine
  std::string masterAddr = "127.0.0.1";  // the rendezvous store
  int masterPort = 29500;                // torchrun's default
};

}  // namespace cohort
