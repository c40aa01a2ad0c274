#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "cohort/config/choices.h"
#include "cohort/core/error.h"
#include "cohort/plan/plan.h"
#include "plan/detail/split.h"

namespace cohort::plan {

namespace {

constexpr double kPlanMb = 1 << 20;

bool jobRecomputes(const JobConfig& job) { return job.model.recompute == Recompute::blocks; }

// ZeRO stage 3 builds the GPT unit by unit (parallel/unit_load.h).
bool builtByUnit(const JobConfig& job, int64_t zero) { return zero == 3 && decoderArch(job.model.arch); }

double gradientMb(const Fit& fit) { return 4 * fit.elements.trainable / kPlanMb; }

}  // namespace

Setting Setting::of(const JobConfig& job, int64_t nodes, int64_t procsPerNode, int64_t cores) {
  Setting s;
  s.nodes = nodes;
  s.procsPerNode = procsPerNode;
  s.threads = job.distribution.threadsPerRank > 0 ? job.distribution.threadsPerRank
                                                  : std::max<int64_t>(1, cores / procsPerNode);
  s.zero = job.distribution.zero;
  s.batchSize = job.training.batchSize;
  s.accumulate = job.training.accumulateSteps;
  s.recompute = jobRecomputes(job);
  s.memoryFormat = job.model.memoryFormat;
  s.bucketCapMb = job.distribution.bucketCapMb;
  const PipelineConfig& p = job.distribution.pipeline;
  s.stages = p.stages;
  s.microBatches = p.stages > 1 ? p.microBatchCount() : 1;
  s.gpipe = p.schedule == PipelineSchedule::gpipe;
  s.tensor = job.distribution.tensor;
  s.sequenceParallel = job.distribution.sequenceParallel;
  return s;
}

std::vector<std::string> Setting::overrides() const {
  return {fmt::format("distribution.nodes={}", nodes),
          fmt::format("distribution.procs_per_node={}", procsPerNode),
          fmt::format("distribution.threads_per_rank={}", threads),
          fmt::format("distribution.zero={}", zero),
          fmt::format("distribution.bucket_cap_mb={:g}", bucketCapMb),
          fmt::format("training.batch_size={}", batchSize),
          fmt::format("training.accumulate_steps={}", accumulate),
          fmt::format("model.recompute={}", recompute ? "blocks" : "none"),
          fmt::format("model.memory_format={}", choiceName(memoryFormat)),
          fmt::format("distribution.pipeline.stages={}", stages),
          fmt::format("distribution.pipeline.micro_batches={}", stages > 1 ? microBatches : 0),
          fmt::format("distribution.pipeline.schedule={}", gpipe ? "gpipe" : "1f1b"),
          fmt::format("distribution.tensor={}", tensor),
          fmt::format("distribution.sequence_parallel={}", sequenceParallel ? "true" : "false")};
}

std::string Setting::describe() const {
  return fmt::format("{} x {} rank{} x {} thread{}, zero {}, batch {} x {}{}{}, buckets {:g} MB", nodes,
                     procsPerNode, procsPerNode == 1 ? "" : "s", threads, threads == 1 ? "" : "s", zero,
                     batchSize, accumulate, recompute ? ", recompute" : "",
                     memoryFormat == MemoryLayout::automatic ? std::string()
                                                             : fmt::format(", {}", choiceName(memoryFormat)),
                     bucketCapMb) +
         (stages > 1 ? fmt::format(", {} stages x {} micro-batches{}", stages, microBatches, gpipe ? " (gpipe)" : "")
                     : std::string()) +
         (tensor > 1 ? fmt::format(", tensor {}{}", tensor, sequenceParallel ? " (sequence parallel)" : "")
                     : std::string());
}

MemoryEstimate predictMemory(const Fit& fit, const JobConfig& job, const Setting& s, double limitMb) {
  if (s.split()) return detail::predictSplitMemory(fit, job, s, limitMb);
  MemoryEstimate m;
  m.state = train::stateBytes(fit.elements, static_cast<int>(s.zero), static_cast<int>(s.ranks()),
                              job.training.optimizer, s.bucketCapMb, builtByUnit(job, s.zero));
  m.baseMb = fit.baseMb;
  const double perSample = s.recompute && fit.measuredRecompute ? fit.recomputeActivationMbPerSample
                                                                : fit.activationMbPerSample;
  m.activationsMb = perSample * double(s.batchSize);
  // Ranks that exchange hold the exchange's buffers, as measured on two
  // local ranks (at fit.exchangeStage: an approximation at other stages).
  if (s.ranks() > 1) m.exchangeMb = fit.exchangeMbPerGradientMb * gradientMb(fit);
  m.peakMb = m.baseMb + m.state.total() / kPlanMb + m.activationsMb + m.exchangeMb;
  m.limitMb = limitMb;
  return m;
}

SpeedEstimate predictSpeed(const Fit& fit, const JobConfig& job, const Setting& s) {
  if (s.split()) return detail::predictSplitSpeed(fit, job, s);
  SpeedEstimate e;
  // Compute scales with the threads a rank has (linearly: optimistic past
  // the threads the probes measured with).
  const double threadScale = double(fit.threads) / double(std::max<int64_t>(1, s.threads));
  const double perSample =
      (s.recompute && fit.measuredRecompute ? fit.recomputeMsPerSample : fit.msPerSample) * threadScale;
  const double micro = perSample * double(s.batchSize);
  const double alone = double(s.accumulate) * micro + fit.msPerStep * threadScale;
  e.computeMs = alone * (s.procsPerNode > 1 ? fit.sharedMachineSlowdown : 1.0);
  const double grads = gradientMb(fit);
  // Stage 3 moves half as much again: parameters gathered in forward and in
  // backward, gradients reduce-scattered (an allreduce's volume is 2x).
  const double volume = s.zero == 3 ? 1.5 : 1.0;
  if (s.procsPerNode > 1) {
    // Shared memory: measured on 2 ranks; a ring's share grows as (P-1)/P.
    const double p = double(s.procsPerNode);
    e.localExchangeMs = fit.localExchangeMsPerMb * grads * volume * ((p - 1) / p) / 0.5;
  }
  if (s.nodes > 1) {
    const double n = double(s.nodes);
    const double bytes = volume * 2 * (n - 1) / n * grads * kPlanMb;
    const double buckets = std::ceil(grads / std::max(1.0, s.bucketCapMb));
    const double messages = 2 * (n - 1) * buckets * volume;
    const double linkMs = bytes * 8 / (fit.link.gbps * 1e9) * 1e3 + messages * fit.link.latencyUs / 1e3;
    if (s.zero == 3) {
      e.linkExchangeMs = linkMs;  // units gathered as they run: no backward to hide in
    } else {
      // Buckets go out while backward runs on: the last bucket's share is
      // exposed at least.
      const double lastBucket = linkMs / std::max(1.0, buckets);
      e.linkExchangeMs = std::max(lastBucket, linkMs - fit.backwardShare * micro);
    }
  }
  e.stepMs = e.computeMs + e.localExchangeMs + e.linkExchangeMs;
  e.samplesPerSecond = double(s.ranks() * s.batchSize * s.accumulate) / (e.stepMs / 1e3);
  e.efficiency = alone / e.stepMs;
  return e;
}

void addUtilization(const Fit& fit, const Setting& s, SpeedEstimate& e) {
  if (fit.modelFlopsPerSample <= 0 || s.ranks() < 1) return;
  e.modelGflopsPerRank = e.samplesPerSecond * fit.modelFlopsPerSample / double(s.ranks()) / 1e9;
  if (fit.ceilingGflops > 0 && s.threads == fit.ceilingThreads) e.mfu = e.modelGflopsPerRank / fit.ceilingGflops;
}

CostEstimate predictCost(const Fit& fit, const JobConfig& job, const Setting& s, const SpeedEstimate& speed,
                         double pricePerNodeHour) {
  CostEstimate c;
  // Each data replica takes its share of the epoch; a pipeline's step
  // takes its micro-batches.
  const int64_t perRank = (fit.epochSamples + s.replicas() - 1) / s.replicas();
  const int64_t batches = job.data.dropLast ? perRank / s.batchSize : (perRank + s.batchSize - 1) / s.batchSize;
  const int64_t perStep = s.accumulate * (s.stages > 1 ? s.microBatches : 1);
  const int64_t perEpoch = (std::max<int64_t>(1, batches) + perStep - 1) / perStep;
  c.steps = perEpoch * job.training.epochs;
  if (job.training.maxSteps > 0) c.steps = std::min(c.steps, job.training.maxSteps);
  c.hours = double(c.steps) * speed.stepMs / 3.6e6;
  c.nodeHours = c.hours * double(s.nodes);
  c.price = c.nodeHours * pricePerNodeHour;
  return c;
}

std::vector<Setting> fittingAlternatives(const Fit& fit, const JobConfig& job, const Setting& s, double limitMb) {
  const auto fits = [&](const Setting& c) { return predictMemory(fit, job, c, limitMb).fits(); };
  const bool canRecompute = fit.measuredRecompute && !s.recompute;
  // On the same ranks: recompute, a higher stage, a smaller micro-batch
  // with more accumulation (the global batch kept), and their mixes.
  std::vector<Setting> same;
  for (bool recompute : {false, true}) {
    if (recompute && !canRecompute) continue;
    for (int64_t zero = s.zero; zero <= 3; ++zero) {
      Setting c = s;
      c.recompute = s.recompute || recompute;
      c.zero = zero;
      for (;;) {
        if ((zero != s.zero || recompute || c.batchSize != s.batchSize) && fits(c)) {
          same.push_back(c);
          break;  // a smaller micro-batch only costs more
        }
        if (c.batchSize % 2 != 0) break;  // halving keeps the global batch only when even
        c.accumulate *= 2;
        c.batchSize /= 2;
      }
    }
  }
  // Nearest first: the fastest.
  std::stable_sort(same.begin(), same.end(), [&](const Setting& x, const Setting& y) {
    return predictSpeed(fit, job, x).stepMs < predictSpeed(fit, job, y).stepMs;
  });
  // Then more machines, at stage 3.
  Setting more = s;
  more.zero = 3;
  more.recompute = s.recompute || canRecompute;
  while (more.ranks() * 2 <= kMaxRanks) {
    more.nodes *= 2;
    if (fits(more)) {
      same.push_back(more);
      break;
    }
  }
  return same;
}

double positiveNumber(const std::string& name, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(v) || v <= 0) {
    throw UsageError(fmt::format("{} {}: expected a positive number", name, value.empty() ? "''" : value));
  }
  return v;
}

int64_t positiveCount(const std::string& name, const std::string& value) {
  const double v = positiveNumber(name, value);
  if (v != std::floor(v) || v > 1e6) {
    throw UsageError(fmt::format("{} {}: expected a positive whole number", name, value));
  }
  return static_cast<int64_t>(v);
}

}  // namespace cohort::plan
