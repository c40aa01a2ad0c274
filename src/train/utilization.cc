#include "train/detail/utilization.h"

#include <fmt/format.h>

#include "cohort/core/env.h"
#include "cohort/core/log.h"

namespace cohort::train::detail {

Utilization measureUtilization(const ModelConfig& model, int64_t height, int64_t width, Precision precision,
                               const ComputeState& compute, const comm::Comm& comm) {
  Utilization u;
  u.flops = models::countModelFlops(model, height, width);
  const std::string dtype = precision == Precision::bf16 ? "bfloat16" : "float32";
  // The other ranks wait while rank 0 measures (once per machine): a
  // product timed beside another rank's work would set the ceiling low.
  comm::barrier(comm, "GEMM ceiling");
  if (comm.rank == 0) {
    // Measured beside other work, one rank of 2 threads once got 68.7
    // GFLOP/s where the quiet machine gives 298.
    const bool busy = machineBusy(compute, env::availableCores());
    const health::Measure how = busy ? health::Measure::once : health::Measure::keep;
    u.ceiling = health::gemmCeiling(dtype, compute.intraOpThreads, how);
    if (u.ceiling && u.ceiling->busy) {
      log::warn("the GEMM ceiling was measured while the machine was busy (load average {:.1f} on {} cores): "
                "used for this run, not kept in {}; `cohort health` on a quiet machine keeps one",
                compute.loadAverage, env::availableCores(), u.ceiling->file);
    }
    if (u.ceiling) {
      log::info("GEMM ceiling {} ({} {})", health::describe(*u.ceiling), u.ceiling->cached ? "from" : "kept in",
                u.ceiling->file);
    } else {
      u.why = "the GEMM ceiling could not be measured";
    }
  }
  comm::barrier(comm, "GEMM ceiling");
  if (!u.flops.known) log::info("model FLOPs not counted: {}", u.flops.why);
  return u;
}

double modelFlopsPerRank(const Utilization& u, double samplesPerS, int worldSize) {
  if (!u.flops.known || worldSize < 1) return 0;
  return u.flops.trainingPerSample * samplesPerS / worldSize;
}

double utilizationFraction(const Utilization& u, double samplesPerS, int worldSize) {
  if (!u.ceiling || !(u.ceiling->gflops > 0)) return 0;
  return modelFlopsPerRank(u, samplesPerS, worldSize) / (u.ceiling->gflops * 1e9);
}

nlohmann::json utilizationJson(const Utilization& u, double samplesPerS, int worldSize, int64_t globalBatch) {
  nlohmann::json j;
  if (!u.flops.known) {
    j["model_flops"] = nullptr;
    j["why"] = u.flops.why;
    return j;
  }
  j["formula"] = u.flops.formula;
  j["forward_flops_per_sample"] = u.flops.forwardPerSample;
  j["model_flops_per_sample"] = u.flops.trainingPerSample;
  j["model_flops_per_step"] = u.flops.trainingPerSample * double(globalBatch);
  j["model_gflops_per_s"] = u.flops.trainingPerSample * samplesPerS / 1e9;
  j["model_gflops_per_s_per_rank"] = modelFlopsPerRank(u, samplesPerS, worldSize) / 1e9;
  if (u.ceiling) {
    const health::GemmCeiling& c = *u.ceiling;
    j["gemm_ceiling"] = {{"gflops_per_s", c.gflops}, {"dtype", c.dtype}, {"threads", c.threads},
                         {"n", c.n},                 {"cpu", c.cpu},     {"measured_at", c.measuredAt},
                         {"cache", c.file},          {"cached", c.cached},
                         {"busy", c.busy},           {"library", c.library},
                         {"holds", c.holds}};
    j["mfu"] = utilizationFraction(u, samplesPerS, worldSize);
  } else {
    j["gemm_ceiling"] = nullptr;
    j["why"] = u.why;
  }
  return j;
}

std::string utilizationText(const Utilization& u, double samplesPerS, int worldSize) {
  if (!u.flops.known) return "model FLOPs not counted: " + u.flops.why;
  std::string out = fmt::format("model {:.1f} GFLOP/s per rank", modelFlopsPerRank(u, samplesPerS, worldSize) / 1e9);
  if (u.ceiling) {
    const int threads = u.ceiling->threads;
    out += fmt::format(", {:.1f}% of the GEMM ceiling ({:.1f} GFLOP/s {} x {} thread{})",
                       100 * utilizationFraction(u, samplesPerS, worldSize), u.ceiling->gflops, u.ceiling->dtype,
                       threads, threads == 1 ? "" : "s");
  }
  return out;
}

}  // namespace cohort::train::detail
