#include "cohort/elastic/round_policy.h"

#include <fmt/format.h>

#include "cohort/core/error.h"

namespace cohort::elastic {

namespace {

// Micro-batches per optimizer step of each replica with `stages` stages.
int64_t microBatches(JobConfig job, int64_t stages) {
  job.distribution.pipeline.stages = stages;
  return microBatchesPerStep(job);
}

std::string plural(int64_t n, const char* one, const char* many) { return fmt::format("{} {}", n, n == 1 ? one : many); }

}  // namespace

std::string RoundLayout::describe() const {
  return fmt::format("{} x {} x {}", plural(replicas, "data replica", "data replicas"),
                     plural(stages, "pipeline stage", "pipeline stages"), plural(tensor, "tensor rank", "tensor ranks"));
}

RoundLayout roundLayout(const JobConfig& job, int64_t worldSize) {
  const DistributionConfig& d = job.distribution;
  RoundLayout l;
  l.tensor = d.tensor;
  if (worldSize % l.tensor != 0) {
    throw ConfigError(fmt::format("distribution.tensor: {} tensor ranks do not divide a round of {} ranks (the "
                                  "tensor split does not change when the world does: every size --nnodes allows "
                                  "must be a multiple of it)",
                                  l.tensor, worldSize));
  }
  const int64_t slices = worldSize / l.tensor;  // replicas x stages
  if (job.elastic.gives == ReformAxis::stages && d.pipeline.stages > 1) {
    const int64_t nominal = std::max<int64_t>(1, requestedWorldSize(job) / (d.pipeline.stages * l.tensor));
    if (slices % nominal == 0 && slices / nominal <= pipelineBlocks(job.model)) {
      l.replicas = nominal;
      l.stages = slices / nominal;
      return l;
    }
  }
  l.stages = std::min(d.pipeline.stages, slices);
  while (slices % l.stages != 0) --l.stages;
  l.replicas = slices / l.stages;
  return l;
}

void applyRoundPolicy(JobConfig& job, int64_t worldSize) {
  const JobConfig written = job;
  const RoundLayout l = roundLayout(written, worldSize);
  PipelineConfig& p = job.distribution.pipeline;
  TrainingConfig& tc = job.training;
  if (l.stages != p.stages) {
    // A replica's step keeps its micro-batches: as the new stages' round
    // when they can fill it, as accumulation without a pipeline.
    const int64_t perReplica = p.microBatchCount();
    p.stages = l.stages;
    p.split = PipelineSplit{};
    p.microBatches = l.stages > 1 && perReplica >= l.stages ? perReplica : 0;  // 0: 4 x stages
    if (l.stages == 1) tc.accumulateSteps *= perReplica;
  }
  const int64_t written_stages = written.distribution.pipeline.stages;
  const int64_t nominalReplicas =
      std::max<int64_t>(1, requestedWorldSize(written) / (written_stages * written.distribution.tensor));
  const int64_t global = tc.batchSize * microBatches(written, written_stages) * nominalReplicas;
  if (job.elastic.batchPolicy == BatchPolicy::keepPerRank) {
    if (tc.optimizer.baseBatch == 0) tc.optimizer.baseBatch = global;
    return;
  }
  // accumulate_steps x (micro-batches of a pipeline's round) per step.
  const int64_t perRound = microBatches(job, l.stages) / tc.accumulateSteps;
  const int64_t perStep = tc.batchSize * perRound * l.replicas;
  if (global % perStep != 0) {
    throw ConfigError(fmt::format(
        "elastic.batch_policy keep_global: the global batch {} (batch_size {} x {} micro-batches per step x "
        "{} data replicas of distribution.nodes x procs_per_node) is not a whole number of batches of {} "
        "ranks ({}) x {}{}; choose sizes that divide it, or keep_per_rank",
        global, tc.batchSize, microBatches(written, written_stages), nominalReplicas, worldSize, l.describe(),
        tc.batchSize, perRound > 1 ? fmt::format(" x {} micro-batches", perRound) : std::string()));
  }
  tc.accumulateSteps = global / perStep;
}

void checkRoundPolicy(const JobConfig& job, int minNodes, int maxNodes) {
  for (int n = minNodes; n <= maxNodes; ++n) {
    JobConfig copy = job;
    applyRoundPolicy(copy, n * job.distribution.procsPerNode);
  }
}

}  // namespace cohort::elastic
