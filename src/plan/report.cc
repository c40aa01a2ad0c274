#include "plan/detail/report.h"

#include <fmt/format.h>

#include "cohort/config/choices.h"

namespace cohort::plan::detail {

namespace {

using ReportJson = nlohmann::json;
constexpr double kMebi = 1 << 20;

std::string durationText(double hours) {
  const double s = hours * 3600;
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  if (hours < 48) return fmt::format("{:.1f} h", hours);
  return fmt::format("{:.1f} d", hours / 24);
}

std::string throughputText(const Fit& fit, double samplesPerSecond) {
  if (fit.blockSize > 0) return fmt::format("{:.0f} tokens/s", samplesPerSecond * double(fit.blockSize));
  return fmt::format("{:.1f} samples/s", samplesPerSecond);
}

}  // namespace

Row predictRow(const Fit& fit, const JobConfig& job, const Setting& s, double limitMb, double price) {
  Row r;
  r.setting = s;
  r.memory = predictMemory(fit, job, s, limitMb);
  r.speed = predictSpeed(fit, job, s);
  addUtilization(fit, s, r.speed);
  r.cost = predictCost(fit, job, s, r.speed, price);
  return r;
}

ReportJson rowJson(const Row& row) {
  const Setting& s = row.setting;
  const MemoryEstimate& m = row.memory;
  return {{"setting",
           {{"nodes", s.nodes},
            {"procs_per_node", s.procsPerNode},
            {"ranks", s.ranks()},
            {"threads_per_rank", s.threads},
            {"zero", s.zero},
            {"batch_size", s.batchSize},
            {"accumulate_steps", s.accumulate},
            {"recompute", s.recompute ? "blocks" : "none"},
            {"memory_format", choiceName(s.memoryFormat)},
            {"bucket_cap_mb", s.bucketCapMb},
            {"pipeline_stages", s.stages},
            {"micro_batches", s.stages > 1 ? s.microBatches : 0},
            {"tensor", s.tensor},
            {"sequence_parallel", s.sequenceParallel},
            {"data_replicas", s.replicas()}}},
          {"memory_mb",
           {{"parameters", m.state.parameters / kMebi},
            {"gradients", m.state.gradients / kMebi},
            {"optimizer_state", m.state.optimizer / kMebi},
            {"gathered_unit_or_buckets", m.state.unit / kMebi},
            {"model_as_built", m.state.wholeModel / kMebi},
            {"activations", m.activationsMb},
            {"exchange_buffers", m.exchangeMb},
            {"runtime", m.baseMb},
            {"peak", m.peakMb},
            {"limit", m.limitMb},
            {"fits", m.fits()},
            {"stage_peaks", m.stagePeakMb}}},
          {"speed",
           {{"compute_ms", row.speed.computeMs},
            {"local_exchange_ms", row.speed.localExchangeMs},
            {"link_exchange_ms", row.speed.linkExchangeMs},
            {"pipeline_idle", row.speed.pipelineIdle},
            {"tensor_mb_per_step", row.speed.tensorMbPerStep},
            {"tensor_exchange_ms", row.speed.tensorExchangeMs},
            {"step_ms", row.speed.stepMs},
            {"samples_per_s", row.speed.samplesPerSecond},
            {"efficiency", row.speed.efficiency},
            {"model_gflops_per_s_per_rank", row.speed.modelGflopsPerRank},
            {"mfu", row.speed.mfu > 0 ? ReportJson(row.speed.mfu) : ReportJson()}}},
          {"cost",
           {{"steps", row.cost.steps},
            {"hours", row.cost.hours},
            {"node_hours", row.cost.nodeHours},
            {"price", row.cost.price}}}};
}

ReportJson reportJson(const Report& r) {
  const Fit& f = r.fit;
  ReportJson j;
  j["job"] = r.jobPath;
  j["name"] = r.jobName;
  j["cpu"] = r.cpu;
  j["cores_per_node"] = r.cores;
  j["memory_limit_mb"] = r.limitMb;
  j["memory_limit_source"] = r.limitSource;
  j["price_per_node_hour"] = r.pricePerNodeHour;
  j["fit"] = {{"trainable_parameters", f.elements.trainable},
              {"frozen_parameters", f.elements.frozen},
              {"buffers", f.elements.buffers},
              {"runtime_mb", f.baseMb},
              {"activation_mb_per_sample", f.activationMbPerSample},
              {"recompute_activation_mb_per_sample", f.measuredRecompute ? f.recomputeActivationMbPerSample : 0.0},
              {"exchange_mb_per_gradient_mb", f.exchangeMbPerGradientMb},
              {"exchange_measured_at_zero", f.exchangeStage},
              {"threads", f.threads},
              {"model_flops_per_sample", f.modelFlopsPerSample},
              {"gemm_ceiling", f.ceilingGflops > 0 ? ReportJson{{"gflops_per_s", f.ceilingGflops},
                                                                 {"threads", f.ceilingThreads},
                                                                 {"dtype", f.ceilingDtype}}
                                                   : ReportJson()},
              {"ms_per_sample", f.msPerSample},
              {"recompute_ms_per_sample", f.measuredRecompute ? f.recomputeMsPerSample : 0.0},
              {"ms_per_step", f.msPerStep},
              {"backward_share", f.backwardShare},
              {"local_exchange_ms_per_mb", f.localExchangeMsPerMb},
              {"shared_machine_slowdown", f.sharedMachineSlowdown},
              {"link_gbps", f.link.gbps},
              {"link_latency_us", f.link.latencyUs},
              {"link_source", f.link.source},
              {"tensor_exchange_ms_per_mb", f.tensorExchangeMsPerMb},
              {"tensor_activation_factor", f.tensorActivationFactor},
              {"pipeline_factor", f.pipelineFactor},
              {"pipeline_extra_mb", f.pipelineExtraMb},
              {"split_probe", f.splitProbe},
              {"epoch_samples", f.epochSamples},
              {"tokens_per_sample", f.blockSize}};
  j["predicted"] = rowJson(r.target);
  j["by_nodes"] = ReportJson::array();
  for (const Row& row : r.byNodes) j["by_nodes"].push_back(rowJson(row));
  j["fits_with"] = ReportJson::array();
  for (const Row& row : r.alternatives) j["fits_with"].push_back(rowJson(row));
  j["probes"] = r.probes;
  j["probe_seconds"] = r.probeSeconds;
  return j;
}

void printReport(const Report& r, std::ostream& out) {
  const Row& t = r.target;
  const MemoryEstimate& m = t.memory;
  const Fit& f = r.fit;
  out << fmt::format("cohort plan: {} ({}), measured on {} in {} probes ({:.0f} s)\n", r.jobName, r.jobPath, r.cpu,
                     r.probes, r.probeSeconds);
  out << fmt::format("setting: {}\n\n", t.setting.describe());
  out << fmt::format("memory per rank ({:.1f}M trainable parameters{}):\n", f.elements.trainable / 1e6,
                     f.elements.frozen > 0 ? fmt::format(", {:.1f}M frozen", f.elements.frozen / 1e6) : "");
  const auto line = [&](const std::string& what, double mb) { out << fmt::format("  {:<36} {:>9.0f} MB\n", what, mb); };
  line("parameters (with buffers)", m.state.parameters / kMebi);
  line("gradients", m.state.gradients / kMebi);
  line("optimizer state", m.state.optimizer / kMebi);
  if (m.state.unit > 0) {
    line(t.setting.zero == 3 ? "one gathered unit" : "gradient buckets in flight", m.state.unit / kMebi);
  }
  if (m.state.wholeModel > m.state.parameters + m.state.gradients + m.state.optimizer + m.state.unit) {
    line("  (the model as built is larger)", m.state.wholeModel / kMebi);
  }
  line(fmt::format("activations ({} x {:.1f} MB{})", t.setting.batchSize,
                   t.setting.recompute ? f.recomputeActivationMbPerSample : f.activationMbPerSample,
                   t.setting.recompute ? ", recompute" : ""),
       m.activationsMb);
  if (f.measuredRecompute) {
    out << fmt::format("  {:<36} {:>9.0f} MB\n",
                       t.setting.recompute ? "  (without recompute)" : "  (with model.recompute: blocks)",
                       (t.setting.recompute ? f.activationMbPerSample : f.recomputeActivationMbPerSample) *
                           double(t.setting.batchSize));
  }
  if (m.exchangeMb > 0) line("exchange buffers", m.exchangeMb);
  line("LibTorch, loader and the rest", m.baseMb);
  if (!m.stagePeakMb.empty()) {
    std::vector<std::string> peaks;
    for (double p : m.stagePeakMb) peaks.push_back(fmt::format("{:.0f}", p));
    out << fmt::format("  {:<36} {:>12} (the largest below)\n", "each stage's rank, MB", fmt::join(peaks, " / "));
  }
  out << fmt::format("  {:<36} {:>9.0f} MB", "peak", m.peakMb);
  if (m.limitMb > 0) {
    out << fmt::format(" of {:.0f} MB ({}): {}", m.limitMb, r.limitSource, m.fits() ? "fits" : "DOES NOT FIT");
  }
  out << "\n";
  if (!m.fits() && !r.alternatives.empty()) {
    out << "  fits with:\n";
    for (size_t i = 0; i < r.alternatives.size() && i < 4; ++i) {
      out << fmt::format("    {} ({:.0f} MB)\n", r.alternatives[i].setting.describe(), r.alternatives[i].memory.peakMb);
    }
  }
  out << fmt::format("\nspeed (compute {:.2f} ms per sample at {} thread{}, {:.1f} ms per step; link {:.2f} Gbit/s, "
                     "{:.0f} us, {}):\n",
                     f.msPerSample, f.threads, f.threads == 1 ? "" : "s", f.msPerStep, f.link.gbps, f.link.latencyUs,
                     f.link.source);
  out << fmt::format("  step {:.1f} ms = compute {:.1f} + exchange on the machine {:.1f} + between machines {:.1f}\n",
                     t.speed.stepMs, t.speed.computeMs, t.speed.localExchangeMs, t.speed.linkExchangeMs);
  if (t.setting.stages > 1) {
    out << fmt::format("  pipeline: {} stages x {} micro-batches, each stage idle {:.0f}% of a step (the ramp up and "
                       "down)\n",
                       t.setting.stages, t.setting.microBatches, 100 * t.speed.pipelineIdle);
  }
  if (t.setting.tensor > 1) {
    out << fmt::format("  tensor split {}: its sums carry {:.2f} MB per step and rank, {:.1f} ms of the step\n",
                       t.setting.tensor, t.speed.tensorMbPerStep, t.speed.tensorExchangeMs);
  }
  if (!f.splitProbe.empty()) out << fmt::format("  (the split fitted to a probe of {})\n", f.splitProbe);
  out << fmt::format("  {}, weak-scaling efficiency {:.0f}%\n", throughputText(f, t.speed.samplesPerSecond),
                     100 * t.speed.efficiency);
  if (t.speed.modelGflopsPerRank > 0) {
    out << fmt::format("  model {:.1f} GFLOP/s per rank", t.speed.modelGflopsPerRank);
    if (t.speed.mfu > 0) {
      out << fmt::format(", {:.0f}% of the GEMM ceiling ({:.1f} GFLOP/s {} x {})", 100 * t.speed.mfu, f.ceilingGflops,
                         f.ceilingDtype, f.ceilingThreads);
    }
    out << "\n";
  }
  out << "\n";
  out << fmt::format("{:>6} {:>6} {:>10} {:>16} {:>6} {:>5} {:>10} {:>11}{}\n", "nodes", "ranks", "step ms",
                     "throughput", "eff.", "MFU", "time", "node-hours", r.pricePerNodeHour > 0 ? "       price" : "");
  for (const Row& row : r.byNodes) {
    out << fmt::format("{:>6} {:>6} {:>10.1f} {:>16} {:>5.0f}% {:>5} {:>10} {:>11.2f}", row.setting.nodes,
                       row.setting.ranks(), row.speed.stepMs, throughputText(f, row.speed.samplesPerSecond),
                       100 * row.speed.efficiency,
                       row.speed.mfu > 0 ? fmt::format("{:.0f}%", 100 * row.speed.mfu) : std::string("-"),
                       durationText(row.cost.hours), row.cost.nodeHours);
    if (r.pricePerNodeHour > 0) out << fmt::format(" {:>11.2f}", row.cost.price);
    out << (row.setting.nodes == t.setting.nodes ? "  <- this job" : "") << "\n";
  }
  out << fmt::format("({} steps to the job's end at {} nodes; evaluation and checkpoints not counted)\n", t.cost.steps,
                     t.setting.nodes);
}

}  // namespace cohort::plan::detail
