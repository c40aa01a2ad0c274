#pragma once

// What a rank of an elastic job (`cohort agent`) trains with in a round of
// some world size. The job file is written for distribution.nodes x
// procs_per_node ranks (the nominal size).
//
// elastic.gives, the layout (ranks = data replicas x pipeline stages x
// tensor ranks, parallel/mesh.h):
//   replicas  the stages and the tensor split stay while the world is a
//             multiple of stages x tensor, and the replicas follow it;
//             otherwise the stages give: the most, up to the job's, whose
//             product with the tensor split divides the world.
//   stages    the replicas of the nominal size stay and the stages follow
//             the world (1 up to the model's blocks); a world they cannot
//             hold is laid out as by replicas.
// The tensor split never changes: a world it does not divide is refused.
// A round with other stages keeps a replica's micro-batches per step (as
// the pipeline's micro_batches, or without a pipeline as accumulate_steps)
// and balances its split anew (auto).
//
// elastic.batch_policy, the batch:
//   keep_global    the global batch stays batch_size x micro-batches per
//                  step x the nominal replicas: accumulate_steps becomes what
//                  keeps it at this round's replicas (and micro-batches),
//                  which must be a whole number.
//   keep_per_rank  batch_size and accumulate_steps stay; the global batch
//                  follows the replicas and the peak learning rate follows
//                  it (the linear rule): optimizer.base_batch when set, else
//                  the global batch at the nominal size.

#include <string>

#include "cohort/config/job.h"

namespace cohort::elastic {

struct RoundLayout {
  int64_t replicas = 1, stages = 1, tensor = 1;
  std::string describe() const;  // "2 data replicas x 2 pipeline stages x 1 tensor rank"
};

// The layout of a round of `worldSize` ranks for `job` as written. Throws
// ConfigError naming distribution.tensor when the tensor split does not
// divide the world.
RoundLayout roundLayout(const JobConfig& job, int64_t worldSize);

// Adjusts `job` (as written) for a round of `worldSize` ranks: its layout
// (the stages; a pipeline split given in the job file goes to auto when the
// stages change) and its batch. Throws ConfigError when the layout cannot
// hold or keep_global cannot keep the global batch at that size.
void applyRoundPolicy(JobConfig& job, int64_t worldSize);

// Checks every world size of MIN..MAX nodes of procs_per_node ranks up
// front (`cohort agent`), so that a resize never fails on it. Throws
// ConfigError naming the first size that does not work.
void checkRoundPolicy(const JobConfig& job, int minNodes, int maxNodes);

}  // namespace cohort::elastic
