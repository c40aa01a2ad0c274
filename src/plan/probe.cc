#include "plan/detail/probe.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/core/fd.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/launch/spawn.h"

namespace cohort::plan::detail {

namespace {

using PlanJson = nlohmann::json;
constexpr double kMiB = 1 << 20;

PlanJson readProbeJson(const std::string& path) {
  try {
    return PlanJson::parse(readFile(path));
  } catch (const PlanJson::exception& e) {
    throw DataError(fmt::format("{}: not the JSON a probe writes: {}", path, e.what()));
  }
}

double medianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

Prober::Prober(std::string executable, std::string jobPath, std::vector<std::string> overrides,
               std::string workDir, int64_t steps, double timeoutS)
    : exe_(std::move(executable)),
      job_(std::move(jobPath)),
      overrides_(std::move(overrides)),
      workDir_(std::move(workDir)),
      steps_(steps),
      timeoutS_(timeoutS) {}

int Prober::execute(const std::vector<std::string>& argv, const std::string& out, const std::string& log,
                    const std::string& what) {
  // Everything the child needs is built before fork.
  UniqueFd outFd(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  UniqueFd logFd(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (outFd.get() < 0 || logFd.get() < 0) throw IoError(fmt::format("cannot create {} or {}", out, log));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(fmt::format("cannot start {}: fork failed", what));
  if (pid == 0) {
    // The probe (and through its own death signal, its ranks) ends with the plan.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(outFd.get(), 1);
    ::dup2(logFd.get(), 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutS_);
  // SIGTERM lets `cohort run` end its ranks; then SIGKILL.
  const auto end = [&] {
    int st = 0;
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 200 && ::waitpid(pid, &st, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (::waitpid(pid, &st, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
    }
  };
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  const timespec now{0, 0};
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) throw Error(fmt::format("waiting for {}: {}", what, std::strerror(errno)));
    // runPlan blocks these: the probe is ended and the plan unwinds
    // (its temporary directory goes), then the signal is taken.
    if (const int sig = ::sigtimedwait(&stops, nullptr, &now); sig > 0) {
      end();
      const std::string message =
          fmt::format("cohort plan: stopped by {} during {}", sig == SIGINT ? "SIGINT" : "SIGTERM", what);
      // Said now: the signal is taken once the plan has unwound.
      log::error("{}", message);
      ::raise(sig);  // pending again until runPlan unblocks it
      throw Error(message);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      end();
      throw TimeoutError(fmt::format("{} did not finish within {:g} s (cohort plan --probe-timeout); its log: {}",
                                     what, timeoutS_, log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

ProbeRun Prober::run(const Setting& s, const std::string& name) {
  ProbeRun p;
  p.setting = s;
  p.setting.nodes = 1;
  p.runDir = workDir_ + "/" + name;
  std::filesystem::remove_all(p.runDir);
  std::vector<std::string> argv{exe_, "run", job_, "--run-dir", p.runDir};
  std::vector<std::string> sets = overrides_;
  for (const auto& o : p.setting.overrides()) sets.push_back(o);
  // A few steps, nothing written but what the plan reads.
  for (const std::string& o :
       {fmt::format("training.max_steps={}", steps_), std::string("training.epochs=1000000"),
        std::string("training.log_every=1"), std::string("data.eval.kind=none"),
        std::string("checkpoint.enabled=false"), std::string("output.save_final=false"),
        std::string("output.progress=off"), std::string("output.tensorboard=false"),
        std::string("output.timeline=false"), std::string("output.metrics_port=0"),
        std::string("distribution.max_restarts=0"), std::string("distribution.preflight=false")}) {
    sets.push_back(o);
  }
  for (const auto& o : sets) {
    argv.push_back("--set");
    argv.push_back(o);
  }
  const std::string log = workDir_ + "/" + name + ".log";
  const std::string what = fmt::format("probe {} ({})", name, p.setting.describe());
  log::info("cohort plan: {}", what);
  ++runs_;
  const int status = execute(argv, workDir_ + "/" + name + ".out", log, what);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw DataError(fmt::format("{} {}; the end of its log ({}):\n{}", what, launch::describeStatus(status), log,
                                tailOfFile(log, 12)));
  }
  const PlanJson summary = readProbeJson(p.runDir + "/summary.json");
  p.peakRssMb = summary.value("peak_rss_mb", 0.0);
  p.epochSamples = summary.value("epoch_samples", int64_t{0});
  if (summary.contains("phase_ms_per_step")) {
    const PlanJson& ph = summary["phase_ms_per_step"];
    p.forwardMs = ph.value("forward", 0.0);
    p.backwardMs = ph.value("backward", 0.0);
    p.optimizerMs = ph.value("optimizer", 0.0);
    p.exposedCommMs = ph.value("exposed_comm", 0.0);
    p.dataWaitMs = ph.value("data_wait", 0.0);
  }
  if (summary.contains("memory") && summary["memory"].contains("elements")) {
    const PlanJson& e = summary["memory"]["elements"];
    p.elementsKnown = true;
    p.elements.trainable = e.value("trainable", 0.0);
    p.elements.frozen = e.value("frozen", 0.0);
    p.elements.buffers = e.value("buffers", 0.0);
    p.elements.unit = e.value("unit", 0.0);
    p.elements.unitWithFrozen = e.value("unit_with_frozen", 0.0);
  }
  if (summary.contains("utilization") && summary["utilization"].is_object()) {
    const PlanJson& u = summary["utilization"];
    p.modelFlopsPerSample = u.value("model_flops_per_sample", 0.0);
    if (u.contains("gemm_ceiling") && u["gemm_ceiling"].is_object()) {
      p.ceilingGflops = u["gemm_ceiling"].value("gflops_per_s", 0.0);
      p.ceilingThreads = u["gemm_ceiling"].value("threads", int64_t{0});
      p.ceilingDtype = u["gemm_ceiling"].value("dtype", "");
    }
  }
  // Steps after the first two: allocations, kernel choices and the
  // loader's first batches are behind them.
  const double globalBatch = summary.value("global_batch", 0.0);
  std::vector<double> ms;
  std::ifstream metrics(p.runDir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const PlanJson r = PlanJson::parse(line, nullptr, false);
    if (r.is_discarded() || r.value("event", "") != "train" || r.value("step", 0) <= 2) continue;
    const double ips = r.value("images_per_s", 0.0);
    if (ips > 0) ms.push_back(1e3 * globalBatch / ips);
  }
  if (ms.empty()) {
    throw DataError(fmt::format("{}: no timed step in {}/metrics.jsonl (cohort plan --probe-steps must be 3 or "
                                "more, and an epoch must hold that many steps)",
                                what, p.runDir));
  }
  p.stepMs = medianOf(ms);
  p.samplesPerSecond = globalBatch / (p.stepMs / 1e3);
  return p;
}

Link Prober::measureLink() {
  // t(bytes) = 2 latency + bytes / bandwidth for two ranks' ring allreduce;
  // `cohort health` reports bus bandwidth, for two ranks bytes / t.
  const double small = 64.0 / 1024, large = 16;
  double seconds[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const double mb = k == 0 ? small : large;
    const std::string name = fmt::format("link-{}", k);
    std::vector<std::string> argv{exe_, "health", "--procs", "2", "--json"};
    for (const std::string& o :
         {fmt::format("health.allreduce_mb={:g}", mb), std::string("health.seconds_per_check=0.3"),
          std::string("health.matmul_size=64"), std::string("health.memory_mb=1"), std::string("health.disk_mb=1"),
          std::string("health.min_matmul_gflops=0"), std::string("health.min_memory_gbps=0"),
          std::string("health.min_disk_write_mbps=0"), std::string("health.min_allreduce_busbw_gbps=0"),
          fmt::format("health.disk_dir={}", workDir_), fmt::format("output.dir={}", workDir_)}) {
      argv.push_back("--set");
      argv.push_back(o);
    }
    const std::string out = workDir_ + "/" + name + ".json", log = workDir_ + "/" + name + ".log";
    const std::string what = fmt::format("the allreduce of {:g} MB between two local ranks (cohort health)", mb);
    log::info("cohort plan: {}", what);
    ++runs_;
    const int status = execute(argv, out, log, what);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw DataError(fmt::format("{} {}; the end of its log ({}):\n{}", what, launch::describeStatus(status), log,
                                  tailOfFile(log, 12)));
    }
    double gbps = 0;
    try {
      gbps = readProbeJson(out).at(0).at("checks").at("allreduce").value("value", 0.0);
    } catch (const PlanJson::exception& e) {
      throw DataError(fmt::format("{}: {} is not the report cohort health writes: {}", what, out, e.what()));
    }
    if (gbps <= 0) throw DataError(fmt::format("{}: measured no bandwidth ({})", what, out));
    seconds[k] = mb * kMiB / (gbps * 1e9);
  }
  Link link;
  const double bytesPerS = (large - small) * kMiB / std::max(1e-9, seconds[1] - seconds[0]);
  link.gbps = bytesPerS * 8 / 1e9;
  link.latencyUs = std::max(1.0, 1e6 * (seconds[0] - small * kMiB / bytesPerS) / 2);
  link.source = "measured between two local ranks (Gloo over TCP)";
  return link;
}

Fit fitProbes(const JobConfig& job, const Probes& p, const Link& link) {
  const ProbeRun& a = *p.a;
  const ProbeRun& b = *p.b;
  if (!a.elementsKnown) {
    throw DataError(fmt::format("probe {}: its summary.json does not count the model's elements", a.runDir));
  }
  Fit f;
  f.elements = a.elements;
  f.epochSamples = a.epochSamples;
  f.blockSize = decoderArch(job.model.arch) ? job.model.blockSize : 0;
  f.threads = a.setting.threads;
  f.link = link;
  f.modelFlopsPerSample = a.modelFlopsPerSample;
  f.ceilingGflops = a.ceilingGflops;
  f.ceilingThreads = a.ceilingThreads;
  f.ceilingDtype = a.ceilingDtype;
  const double state0 = train::stateBytes(f.elements, 0, 1, job.training.optimizer, a.setting.bucketCapMb).total() / kMiB;
  const double db = double(a.setting.batchSize - b.setting.batchSize);
  const double bA = double(a.setting.batchSize);
  // Memory: what grows with the micro-batch is activations; the rest of
  // what the state does not explain is LibTorch, the loader and the like.
  const double act = std::max(0.0, (a.peakRssMb - b.peakRssMb) / db);
  f.baseMb = a.peakRssMb - state0 - act * bA;
  if (f.baseMb < 0) {
    // The peak grew less than the state alone: take the state as all of it.
    log::warn("cohort plan: probe {} held {:.0f} MB, less than its training state and activations ({:.0f} MB); "
              "counting nothing besides them",
              a.runDir, a.peakRssMb, state0 + act * bA);
    f.baseMb = 0;
  }
  // Speed: a step is its optimizer step (timed apart) and the micro-step,
  // taken as proportional to the samples (a difference of two step times
  // would be mostly noise on a busy machine).
  f.msPerStep = std::min(a.optimizerMs, 0.5 * a.stepMs);
  f.msPerSample = (a.stepMs - f.msPerStep) / bA;
  const double compute = a.forwardMs + a.backwardMs;
  if (compute > 0) f.backwardShare = a.backwardMs / compute;
  const bool recomputes = a.setting.recompute;
  (recomputes ? f.recomputeActivationMbPerSample : f.activationMbPerSample) = act;
  (recomputes ? f.recomputeMsPerSample : f.msPerSample) = f.msPerSample;
  if (p.c != nullptr) {
    const ProbeRun& c = *p.c;
    const double cb = double(c.setting.batchSize);
    const double otherAct = std::max(0.0, (c.peakRssMb - state0 - f.baseMb) / cb);
    const double otherMs = std::max(0.0, (c.stepMs - std::min(c.optimizerMs, 0.5 * c.stepMs)) / cb);
    (recomputes ? f.activationMbPerSample : f.recomputeActivationMbPerSample) = otherAct;
    (recomputes ? f.msPerSample : f.recomputeMsPerSample) = otherMs;
    f.measuredRecompute = true;
  } else if (recomputes) {
    // Only the recomputing setting measured: without it is not predicted.
    f.activationMbPerSample = f.recomputeActivationMbPerSample;
    f.msPerSample = f.recomputeMsPerSample;
  }
  if (p.d != nullptr) {
    const ProbeRun& d = *p.d;
    const double grads = 4 * f.elements.trainable / kMiB;
    // What two ranks held beyond their state and activations: the
    // exchange's buffers (buckets, shared memory, gathered units beyond the
    // state's count, the heap they leave behind), per MB of gradients.
    const MemoryEstimate m = predictMemory(f, job, d.setting, 0);
    f.exchangeMbPerGradientMb = grads > 0 ? std::max(0.0, (d.peakRssMb - m.peakMb) / grads) : 0;
    f.exchangeStage = d.setting.zero;
    // The exchange exposed between two local ranks.
    f.localExchangeMsPerMb = grads > 0 ? d.exposedCommMs / grads : 0;
    // Ranks that share a machine compute slower than one alone (memory
    // bandwidth, the loaders' threads on the same cores): the two ranks'
    // step without its exchange against one rank's of the same micro-batch
    // at the same threads.
    const double alone = b.stepMs * double(b.setting.threads) / double(d.setting.threads);
    f.sharedMachineSlowdown = std::max(1.0, (d.stepMs - d.exposedCommMs) / alone);
  }
  return f;
}

}  // namespace cohort::plan::detail
