#include "plan/detail/tune.h"

#include <fmt/format.h>

#include <set>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::plan::detail {

namespace {

bool imageModel(const JobConfig& job) {
  return !decoderArch(job.model.arch) && job.model.arch != ModelArch::torchscript;
}

// The candidates along one dimension from `s`, the global batch kept.
std::vector<Setting> along(int dim, const Setting& s, const JobConfig& job, int64_t localCores) {
  std::vector<Setting> out;
  const int64_t perNode = s.procsPerNode * s.batchSize * s.accumulate;  // samples per node and step
  switch (dim) {
    case 0:  // ranks per machine against threads per rank
      if (s.split()) break;  // the split holds the ranks (case 6)
      for (int64_t p = 1; p <= localCores; p *= 2) {
        if (p == s.procsPerNode || perNode % p != 0) continue;
        Setting c = s;
        c.procsPerNode = p;
        c.threads = std::max<int64_t>(1, s.threads * s.procsPerNode / p);
        const int64_t rankSamples = perNode / p;  // batch x accumulate per rank
        c.accumulate = std::max<int64_t>(1, std::min(s.accumulate, rankSamples));
        while (rankSamples % c.accumulate != 0) --c.accumulate;
        c.batchSize = rankSamples / c.accumulate;
        out.push_back(c);
      }
      break;
    case 1:  // ZeRO stage (only ranks that exchange shard anything)
      if (s.ranks() > 1) {
        for (int64_t z = 0; z <= 3; ++z) {
          if (z == s.zero) continue;
          Setting c = s;
          c.zero = z;
          out.push_back(c);
        }
      }
      break;
    case 2:  // micro-batch against accumulation
      for (int64_t k : {s.accumulate * 2, s.accumulate / 2}) {
        const int64_t samples = s.batchSize * s.accumulate;
        if (k < 1 || k == s.accumulate || samples % k != 0) continue;
        Setting c = s;
        c.accumulate = k;
        c.batchSize = samples / k;
        out.push_back(c);
      }
      break;
    case 3:  // recompute
      if (pipelineBlocks(job.model) > 0) {  // model.recompute works by block
        Setting c = s;
        c.recompute = !s.recompute;
        out.push_back(c);
      }
      break;
    case 4:  // memory format
      if (imageModel(job)) {
        for (MemoryLayout m : {MemoryLayout::channelsLast, MemoryLayout::contiguous}) {
          if (m == s.memoryFormat) continue;
          Setting c = s;
          c.memoryFormat = m;
          out.push_back(c);
        }
      }
      break;
    case 5:  // bucket size (ranks that exchange)
      if (s.ranks() > 1) {
        for (double mb : {s.bucketCapMb / 4, s.bucketCapMb * 4}) {
          Setting c = s;
          c.bucketCapMb = mb;
          out.push_back(c);
        }
      }
      break;
    case 6:  // the GPT's split: stages (and their micro-batches) and tensor ranks, the ranks kept
      if (job.model.arch == ModelArch::gpt) {
        const int64_t ranks = s.procsPerNode;  // per machine: a split stays on one
        const int64_t m = s.stages > 1 ? s.microBatches : 1;
        const int64_t perStep = s.replicas() * s.batchSize * s.accumulate * m;  // the global batch
        auto add = [&](int64_t p, int64_t t, int64_t micro) {
          if (ranks % (p * t) != 0 || p > job.model.nLayer || job.model.nHead % t != 0) return;
          if (p == s.stages && t == s.tensor && (p == 1 || micro == s.microBatches)) return;
          Setting c = s;
          c.stages = p;
          c.tensor = t;
          c.microBatches = p > 1 ? micro : 1;
          c.sequenceParallel = t > 1 && s.sequenceParallel;
          const int64_t perReplica = perStep / c.replicas();
          if (perStep % c.replicas() != 0 || perReplica % c.microBatches != 0) return;
          const int64_t samples = perReplica / c.microBatches;  // batch x accumulation
          c.accumulate = std::max<int64_t>(1, std::min(s.accumulate, samples));
          while (samples % c.accumulate != 0) --c.accumulate;
          c.batchSize = samples / c.accumulate;
          out.push_back(c);
        };
        for (int64_t p : {int64_t{1}, int64_t{2}}) {
          for (int64_t t : {int64_t{1}, int64_t{2}}) add(p, t, 4 * p);
        }
        if (s.stages > 1) {
          for (int64_t micro : {2 * s.stages, 8 * s.stages}) add(s.stages, s.tensor, micro);
        }
      }
      break;
  }
  return out;
}

}  // namespace

TuneResult tune(Prober& prober, const Fit& fit, const JobConfig& job, const Setting& target, double limitMb,
                int64_t localCores) {
  TuneResult r;
  std::set<std::string> seen;
  double bestSps = -1;
  Setting best = target;
  const auto attempt = [&](const Setting& c) {
    if (!seen.insert(c.describe()).second) return;
    Tried t;
    t.predicted = predictRow(fit, job, c, limitMb, 0);
    if (!t.predicted.memory.fits()) {
      t.note = fmt::format("predicted {:.0f} MB of {:.0f}", t.predicted.memory.peakMb, limitMb);
    } else if (c.procsPerNode > localCores) {
      t.note = fmt::format("{} ranks per machine: this machine has {} cores", c.procsPerNode, localCores);
    } else {
      try {
        const ProbeRun p = prober.run(c, fmt::format("tune-{}", r.tried.size()));
        t.ran = true;
        t.peakRssMb = p.peakRssMb;
        // Measured on one machine, plus the exchange between machines as predicted.
        t.stepMs = p.stepMs + t.predicted.speed.linkExchangeMs;
        t.samplesPerSecond =
            double(c.replicas() * c.batchSize * c.accumulate * (c.stages > 1 ? c.microBatches : 1)) / (t.stepMs / 1e3);
      } catch (const Error& e) {
        t.note = e.what();
        const auto nl = t.note.find('\n');
        if (nl != std::string::npos) t.note.resize(nl);
      }
    }
    r.tried.push_back(t);
    if (t.ran && t.samplesPerSecond > bestSps) {
      bestSps = t.samplesPerSecond;
      best = c;
      r.bestIndex = r.tried.size() - 1;
    }
  };
  attempt(target);
  if (!r.tried[0].ran) {
    log::warn("cohort plan --tune: the job's own setting did not run ({}); tuning from it anyway",
              r.tried[0].note);
  }
  for (int dim = 0; dim < 7; ++dim) {
    const Setting from = best;
    for (const Setting& c : along(dim, from, job, localCores)) attempt(c);
  }
  if (bestSps < 0) {
    throw ConfigError(fmt::format("cohort plan --tune: no candidate ran; the first said: {}", r.tried[0].note));
  }
  r.best = best;
  return r;
}

std::string tuneTable(const TuneResult& r, const Fit& fit, const std::string& prefix) {
  const std::string unit = fit.blockSize > 0 ? "tokens/s" : "samples/s";
  const double scale = fit.blockSize > 0 ? double(fit.blockSize) : 1.0;
  std::string out = fmt::format("{}{:>3}  {:<78} {:>10} {:>10} {:>12}  {}\n", prefix, "", "setting", "pred. MB",
                                "meas. MB", unit, "");
  for (size_t i = 0; i < r.tried.size(); ++i) {
    const Tried& t = r.tried[i];
    const std::string mark = i == r.bestIndex ? "<- fastest" : i == 0 ? "(the job as written)" : "";
    out += fmt::format("{}{:>3}  {:<78} {:>10.0f} {:>10} {:>12}  {}\n", prefix, i, t.predicted.setting.describe(),
                       t.predicted.memory.peakMb, t.ran ? fmt::format("{:.0f}", t.peakRssMb) : "-",
                       t.ran ? fmt::format("{:.1f}", t.samplesPerSecond * scale) : "-",
                       t.ran ? mark : "skipped: " + t.note);
  }
  return out;
}

}  // namespace cohort::plan::detail
