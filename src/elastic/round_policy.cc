#include "cohort/elastic/batch_policy.h"

#include <fmt/format.h>

#include "cohort/core/error.h"

namespace cohort::elastic {

void applyBatchPolicy(JobConfig& job, int64_t worldSize) {
  TrainingConfig& tc = job.training;
  const int64_t nominal = requestedWorldSize(job);
  const int64_t global = tc.batchSize * tc.accumulateSteps * nominal;
  if (job.elastic.batchPolicy == BatchPolicy::keepPerRank) {
    if (tc.optimizer.baseBatch == 0) tc.optimizer.baseBatch = global;
    return;
  }
  const int64_t perStep = tc.batchSize * worldSize;
  if (global % perStep != 0) {
    throw ConfigError(fmt::format(
        "elastic.batch_policy keep_global: the global batch {} (batch_size {} x accumulate_steps "
        "{} x {} ranks of distribution.nodes x procs_per_node) is not a whole number of batches of "
        "{} ranks x {}; choose sizes that divide it, or keep_per_rank",
        global, tc.batchSize, tc.accumulateSteps, nominal, worldSize, tc.batchSize));
  }
  tc.accumulateSteps = global / perStep;
}

void checkBatchPolicy(const JobConfig& job, int minNodes, int maxNodes) {
  for (int n = minNodes; n <= maxNodes; ++n) {
    JobConfig copy = job;
    applyBatchPolicy(copy, n * job.distribution.procsPerNode);
  }
}

}  // namespace cohort::elastic
