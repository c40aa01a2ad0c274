// `cohort plan`: options, the probes, the prediction and the report.

#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <set>

#include "cohort/config/load.h"
#include "cohort/core/cpu.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/memory_limit.h"
#include "cohort/launch/spawn.h"
#include "plan/detail/probe.h"
#include "plan/detail/split.h"
#include "plan/detail/report.h"
#include "plan/detail/tune.h"

namespace cohort::plan {

namespace {

// "8G", "512M", "1.5GiB", "2048" (MB).
double memoryMb(const std::string& value) {
  size_t digits = 0;
  while (digits < value.size() && (std::isdigit(static_cast<unsigned char>(value[digits])) || value[digits] == '.')) {
    ++digits;
  }
  std::string unit = value.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "M" || unit == "MB" || unit == "MIB") scale = 1;
  if (unit == "G" || unit == "GB" || unit == "GIB") scale = 1024;
  if (unit == "T" || unit == "TB" || unit == "TIB") scale = 1024 * 1024;
  if (scale == 0 || digits == 0) {
    throw UsageError(fmt::format("--memory-per-rank {}: expected a positive size such as 8G or 4096M", value));
  }
  return positiveNumber("--memory-per-rank", value.substr(0, digits)) * scale;
}

// The probes' directory: the one given (kept) or a temporary one (removed).
class WorkDir {
 public:
  explicit WorkDir(const std::string& given) {
    if (!given.empty()) {
      path_ = given;
      std::filesystem::create_directories(path_);
      return;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/cohort-plan.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw IoError(fmt::format("cannot create {}", pattern));
    path_ = pattern;
    owned_ = true;
  }
  ~WorkDir() {
    std::error_code ec;
    if (owned_) std::filesystem::remove_all(path_, ec);
  }
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool owned_ = false;
};

// While the plan runs, SIGINT and SIGTERM wait (the prober ends the probe
// it runs and the plan unwinds, removing its directory), and SIGCHLD is not
// ignored (its probes are waited for). Restored on the way out, when a
// signal that came is taken.
class SignalsHeld {
 public:
  SignalsHeld() {
    sigset_t stops;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    ::sigprocmask(SIG_BLOCK, &stops, &old_);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGCHLD, &dfl, &oldChld_);
  }
  ~SignalsHeld() {
    ::sigaction(SIGCHLD, &oldChld_, nullptr);
    ::sigprocmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t old_{};
  struct sigaction oldChld_ {};
};

std::string defaultTuneOutput(const std::string& jobPath) {
  std::string base = jobPath;
  for (const char* ext : {".yaml", ".yml"}) {
    const std::string e = ext;
    if (base.size() > e.size() && base.compare(base.size() - e.size(), e.size(), e) == 0) {
      base.resize(base.size() - e.size());
      break;
    }
  }
  return base + ".tuned.yaml";
}

}  // namespace

int runPlan(const PlanOptions& o, std::ostream& out) {
  // Every number first: a bad one costs no probe.
  const auto count = [](const std::string& name, const std::string& v) -> int64_t {
    return v.empty() ? 0 : positiveCount(name, v);
  };
  const int64_t nodesArg = count("--nodes", o.nodes);
  const int64_t procsArg = count("--procs-per-node", o.procsPerNode);
  const int64_t coresArg = count("--cores-per-node", o.coresPerNode);
  const double limitArg = o.memoryPerRank.empty() ? 0 : memoryMb(o.memoryPerRank);
  const double price = o.pricePerNodeHour.empty() ? 0 : positiveNumber("--price-per-node-hour", o.pricePerNodeHour);
  const double gbpsArg = o.linkGbps.empty() ? 0 : positiveNumber("--link-gbps", o.linkGbps);
  const double latencyArg = o.linkLatencyUs.empty() ? 0 : positiveNumber("--link-latency-us", o.linkLatencyUs);
  if (o.probeSteps < 3) throw UsageError(fmt::format("--probe-steps {}: at least 3 (two are not timed)", o.probeSteps));
  if (!(o.probeTimeoutS > 0)) throw UsageError(fmt::format("--probe-timeout {}: expected a positive number", o.probeTimeoutS));

  const JobConfig job = loadJob(o.jobPath, o.overrides);
  const int64_t nodes = nodesArg > 0 ? nodesArg : job.distribution.nodes;
  const int64_t procs = procsArg > 0 ? procsArg : job.distribution.procsPerNode;
  const int64_t localCores = env::availableCores();
  const int64_t cores = coresArg > 0 ? coresArg : localCores;
  checkRanks(job, nodes * procs);
  if ((job.distribution.pipeline.stages > 1 || job.distribution.tensor > 1) && job.model.arch != ModelArch::gpt) {
    throw ConfigError(fmt::format("{}: cohort plan models a split (distribution.pipeline.stages {}, distribution.tensor "
                                  "{}) of gpt only, not model.arch {}",
                                  o.jobPath, job.distribution.pipeline.stages, job.distribution.tensor,
                                  choiceName(job.model.arch)));
  }
  detail::Report report;
  report.jobPath = o.jobPath;
  report.jobName = job.name;
  report.cpu = describe(cpuInfo());
  report.cores = cores;
  report.pricePerNodeHour = price;
  if (limitArg > 0) {
    report.limitMb = limitArg;
    report.limitSource = "--memory-per-rank";
  } else {
    // The ranks `cohort run` starts share its machine and its memory cgroup.
    // Ranks in cgroups of their own (Slurm's task/cgroup, a container per
    // rank) each have a limit of their own: --memory-per-rank says it.
    const memory::Limit limit = memory::processLimit();
    report.limitMb = double(limit.bytes) / (1 << 20) / double(procs);
    report.limitSource = fmt::format("this machine's {} / {} rank{}{}", limit.source, procs, procs == 1 ? "" : "s",
                                     limit.source == "MemTotal" || procs == 1
                                         ? ""
                                         : "; with a memory cgroup per rank, give its limit as --memory-per-rank");
  }

  if (nodes * procs > kMaxRanks) {
    throw UsageError(fmt::format("--nodes {} x --procs-per-node {}: at most {} ranks", nodes, procs, kMaxRanks));
  }
  const Setting target = Setting::of(job, nodes, procs, cores);
  SignalsHeld signals;  // before the directory: it goes first
  WorkDir work(o.workDir);
  detail::Prober prober(o.executable.empty() ? launch::selfExecutable() : o.executable, o.jobPath, o.overrides,
                        work.path(), o.probeSteps, o.probeTimeoutS);
  const auto started = std::chrono::steady_clock::now();
  // One rank at the job's micro-batch and at another: what grows with it.
  Setting a = target;
  a.nodes = a.procsPerNode = 1;
  a.stages = a.microBatches = a.tensor = 1;
  a.gpipe = a.sequenceParallel = false;
  a.threads = std::min(target.threads, localCores);
  a.zero = 0;
  a.accumulate = 1;
  Setting b = a;
  b.batchSize = a.batchSize >= 2 ? a.batchSize / 2 : 2;
  const detail::ProbeRun pa = prober.run(a, "one-rank");
  const detail::ProbeRun pb = prober.run(b, "one-rank-batch");
  std::optional<detail::ProbeRun> pc, pd;
  if (pipelineBlocks(job.model) > 0) {  // model.recompute works by block
    Setting c = a;
    c.recompute = !a.recompute;
    pc = prober.run(c, "one-rank-recompute");
  }
  if (target.ranks() > 1 && localCores >= 2) {
    // Two ranks at the job's stage and the smaller micro-batch: the
    // exchange's buffers and time, and what sharing the machine costs,
    // against the one rank of the same micro-batch.
    Setting d = b;
    d.procsPerNode = 2;
    d.threads = std::max<int64_t>(1, localCores / 2);
    d.zero = target.zero;
    pd = prober.run(d, "two-ranks");
  }
  // A split: probed on this machine's ranks (2 where the model allows),
  // to fit its exchanges and the pipeline's pace (plan/detail/split.h).
  std::optional<detail::ProbeRun> pt, pp;
  if (target.tensor > 1 && localCores >= 2) {
    Setting t = b;
    const int64_t two = job.model.nHead % 2 == 0 && job.model.vocabSize % 2 == 0 ? 2 : target.tensor;
    t.procsPerNode = t.tensor = two;
    t.sequenceParallel = target.sequenceParallel;
    t.threads = std::max<int64_t>(1, localCores / two);
    pt = prober.run(t, "tensor-split");
  }
  if (target.stages > 1 && localCores >= 2) {
    Setting p = b;
    p.procsPerNode = p.stages = 2;
    p.microBatches = std::max<int64_t>(2, target.microBatches * 2 / target.stages);
    p.gpipe = target.gpipe;
    p.threads = std::max<int64_t>(1, localCores / 2);
    pp = prober.run(p, "pipeline");
  }
  Link link;
  if (gbpsArg > 0 && latencyArg > 0) {
    link = {gbpsArg, latencyArg, "given"};
  } else {
    link = prober.measureLink();
    if (gbpsArg > 0) link.gbps = gbpsArg;
    if (latencyArg > 0) link.latencyUs = latencyArg;
    if (gbpsArg > 0 || latencyArg > 0) link.source += ", partly given";
  }
  report.fit = detail::fitProbes(job, {&pa, &pb, pc ? &*pc : nullptr, pd ? &*pd : nullptr}, link);
  if (pt || pp) detail::calibrateSplit(report.fit, job, pt ? &*pt : nullptr, pp ? &*pp : nullptr);
  const Fit& fit = report.fit;
  report.target = detail::predictRow(fit, job, target, report.limitMb, price);
  std::set<int64_t> counts{1, 2, 4, 8, 16, 32, 64, nodes};
  for (int64_t n : counts) {
    Setting s = target;
    s.nodes = n;
    report.byNodes.push_back(detail::predictRow(fit, job, s, report.limitMb, price));
  }
  if (!report.target.memory.fits()) {
    for (const Setting& s : fittingAlternatives(fit, job, target, report.limitMb)) {
      report.alternatives.push_back(detail::predictRow(fit, job, s, report.limitMb, price));
    }
    if (report.alternatives.empty()) {
      // The closest: stage 3, recompute, micro-batch 1, on the most ranks tried.
      Setting closest = target;
      closest.zero = 3;
      closest.recompute = closest.recompute || fit.measuredRecompute;
      closest.accumulate *= closest.batchSize;
      closest.batchSize = 1;
      closest.nodes = std::max<int64_t>(closest.nodes, kMaxRanks / closest.procsPerNode);
      const MemoryEstimate m = predictMemory(fit, job, closest, report.limitMb);
      throw ConfigError(fmt::format(
          "{}: the job cannot fit in {:.0f} MB per rank ({}) at any setting: {} needs {:.0f} MB per rank, and the "
          "closest, {}, still needs {:.0f} MB ({:.0f} MB of it LibTorch, the loader and the rest, {:.0f} MB "
          "activations, {:.0f} MB of one gathered unit and what every rank holds whole); give each rank more memory",
          o.jobPath, report.limitMb, report.limitSource, target.describe(), report.target.memory.peakMb,
          closest.describe(), m.peakMb, m.baseMb, m.activationsMb, m.state.total() / (1 << 20)));
    }
  }
  report.probes = prober.runs();
  report.probeSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // Kept where a run of this very job (on these ranks) finds it: its
  // summary.json then sets the prediction beside what it measured.
  JobConfig planned = job;
  planned.distribution.nodes = nodes;
  planned.distribution.procsPerNode = procs;
  const std::string saved = savedPlanPath(planned);
  writeFileAtomic(saved, detail::reportJson(report).dump(2) + "\n");
  log::info("cohort plan: kept as {}: a run of this job on {} x {} ranks puts it beside its figures in summary.json",
            saved, nodes, procs);

  if (o.tune) {
    const detail::TuneResult t = detail::tune(prober, fit, job, target, report.limitMb, localCores);
    const std::string path = o.tuneOutput.empty() ? defaultTuneOutput(o.jobPath) : o.tuneOutput;
    std::vector<std::string> sets = o.overrides;
    for (const auto& s : t.best.overrides()) sets.push_back(s);
    const JobConfig tuned = loadJob(o.jobPath, sets);
    const std::string table = detail::tuneTable(t, fit, "# ");
    writeFileAtomic(path, fmt::format("# Written by `cohort plan --tune` from {} on {}.\n# What it tried ({} steps "
                                      "each on this machine; throughput at {} node{}):\n{}#\n{}",
                                      o.jobPath, report.cpu, o.probeSteps, nodes, nodes == 1 ? "" : "s", table,
                                      toYaml(tuned)));
    report.probes = prober.runs();
    report.probeSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (o.json) {
      nlohmann::json j = detail::reportJson(report);
      j["tune"] = {{"job_file", path}, {"best", t.bestIndex}, {"tried", nlohmann::json::array()}};
      for (const auto& tr : t.tried) {
        nlohmann::json row = detail::rowJson(tr.predicted);
        row["ran"] = tr.ran;
        row["measured"] = {{"step_ms", tr.stepMs}, {"samples_per_s", tr.samplesPerSecond}, {"peak_rss_mb", tr.peakRssMb}};
        if (!tr.note.empty()) row["note"] = tr.note;
        j["tune"]["tried"].push_back(row);
      }
      out << j.dump(2) << "\n";
    } else {
      detail::printReport(report, out);
      out << fmt::format("\ntuning ({} steps per candidate):\n{}wrote {} ({})\n", o.probeSteps,
                         detail::tuneTable(t, fit, ""), path, t.best.describe());
    }
    return 0;
  }
  if (o.json) {
    out << detail::reportJson(report).dump(2) << "\n";
  } else {
    detail::printReport(report, out);
  }
  return 0;
}

}  // namespace cohort::plan
