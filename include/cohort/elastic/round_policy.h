#pragma once

// elastic.batch_policy: what a rank of an elastic job trains with at the
// world size of its round. The job file is written for distribution.nodes x
// procs_per_node ranks (the nominal size).
//
//   keep_global    the global batch stays batch_size x accumulate_steps x the
//                  nominal size: accumulate_steps becomes global / (batch_size
//                  x world), which must be a whole number.
//   keep_per_rank  batch_size and accumulate_steps stay; the global batch
//                  follows the world size and the peak learning rate follows
//                  it (the linear rule): optimizer.base_batch when set, else
//                  the global batch at the nominal size.

#include "cohort/config/job.h"

namespace cohort::elastic {

// Adjusts `job` for a round of `worldSize` ranks. Throws ConfigError when
// keep_global cannot keep the global batch at that size.
void applyBatchPolicy(JobConfig& job, int64_t worldSize);

// Checks every world size of MIN..MAX nodes of procs_per_node ranks up
// front (`cohort agent`), so that a resize never fails on it. Throws
// ConfigError naming the first size that does not work.
void checkBatchPolicy(const JobConfig& job, int minNodes, int maxNodes);

}  // namespace cohort::elastic
