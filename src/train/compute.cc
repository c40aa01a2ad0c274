#include "cohort/train/compute.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cctype>
#include <climits>
#include <nlohmann/json.hpp>
#include <vector>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/malloc_policy.h"
#include "cohort/models/fused_ops.h"
#include "cohort/models/linear.h"
#include "cohort/models/model.h"
#include "cohort/train/bind_cores.h"
#include "cohort/train/precision.h"

namespace cohort::train {

namespace {

std::atomic<bool> boundToCores{false};

// "CPU capability usage: AVX2" in LibTorch's build description: the only
// public report of the kernels its dispatcher chose for this CPU.
std::string kernelCapability() {
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage:";
  const auto at = config.find(key);
  if (at == std::string::npos) return "unknown";
  const auto begin = config.find_first_not_of(' ', at + key.size());
  const auto end = config.find('\n', begin);
  return config.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::string oneDnnHeld;  // applyCompute's note (oneDnnNote)

std::string fitOneDnnToPrecision(const JobConfig& job, Precision precision) {
  if (precision != Precision::bf16 || !at::globalContext().userEnabledMkldnn()) return "";
  if (!env::onednnHeldBelowBf16()) return "";
  const std::string why = fmt::format("oneDNN is held to {} (ONEDNN_MAX_CPU_ISA), which has no bf16 kernels, "
                                      "and LibTorch sends bf16 to it on this CPU",
                                      *env::onednnMaxIsa());
  if (job.compute.onednn == OneDnn::on) {
    throw ConfigError("compute.onednn: on with training.precision bf16: " + why +
                      "; set compute.onednn: auto (LibTorch's own kernels run) or lift the limit");
  }
  at::globalContext().setUserEnabledMkldnn(false);
  return "oneDNN off: " + why + "; LibTorch's own kernels run bf16, as on a CPU without AVX-512";
}

}  // namespace

void applyCompute(const JobConfig& job, int localRanks, int localRank) {
  int threads = static_cast<int>(job.distribution.threadsPerRank);
  // srun's --cpus-per-task is this rank's share already.
  if (threads == 0) threads = env::slurmCpusPerTask().value_or(0);
  if (threads == 0) threads = std::max(1, env::availableCores() / std::max(1, localRanks));
  // Before LibTorch starts its threads: they inherit the binding.
  const std::vector<int> cores = coresOfRank(job.compute.bindCores, allowedCores(), localRank, localRanks, threads);
  if (!cores.empty()) {
    bindProcess(cores);
    boundToCores = true;
  }
  at::set_num_threads(threads);
  // Once set (or once LibTorch has started its pool) it cannot change: a
  // second call in the same process throws.
  if (at::get_num_interop_threads() != 1) at::set_num_interop_threads(1);
  // mallopt() tunes glibc's malloc: with tcmalloc or jemalloc preloaded it
  // does not apply (observeCompute reports which one serves); anything else
  // (glibc, a sanitizer's) is asked as before.
  const std::string serving = env::servingMalloc().name;
  const bool tunable = serving != "tcmalloc" && serving != "jemalloc";
  if (tunable && job.compute.allocator == Allocator::keep && !keepFreedMemory()) {
    throw ConfigError("compute.allocator: keep: glibc refused mallopt(); set compute.allocator: "
                      "system to run with its defaults");
  }
  if (tunable && job.compute.allocator == Allocator::map && !mapLargeBlocks()) {
    throw ConfigError("compute.allocator: map: glibc refused mallopt(); set compute.allocator: "
                      "system to run with its defaults");
  }
  const OneDnn dnn = job.compute.onednn;
  if (dnn == OneDnn::on && !at::hasMKLDNN()) {
    throw ConfigError("compute.onednn: on, but this LibTorch was built without oneDNN (MKL-DNN); "
                      "use auto or off");
  }
  at::globalContext().setUserEnabledMkldnn(dnn != OneDnn::off && at::hasMKLDNN());
  oneDnnHeld = fitOneDnnToPrecision(job, resolvePrecision(job.training.precision, cpuInfo()).precision);
}

const std::string& oneDnnNote() { return oneDnnHeld; }

ComputeState observeCompute() {
  ComputeState s;
  s.cpu = cpuInfo();
  s.kernels = kernelCapability();
  s.intraOpThreads = at::get_num_threads();
  s.interOpThreads = at::get_num_interop_threads();
  s.allocator = mallocPolicy();
  const env::MallocInfo m = env::servingMalloc();
  s.mallocName = m.name;
  s.mallocLibrary = m.library;
  s.onednn = at::hasMKLDNN() && at::globalContext().userEnabledMkldnn();
  s.observers = at::hasGlobalCallbacks() || at::hasThreadLocalCallbacks();
  s.anomalyMode = torch::autograd::AnomalyMode::is_enabled();
  s.gradMode = at::GradMode::is_enabled();
  s.boundCores = boundToCores;
  s.cores = describeCores(allowedCores());
  if (auto v = env::namedVariable("OMP_WAIT_POLICY")) {
    s.openMpWait = "OMP_WAIT_POLICY=" + *v;
  } else if (auto c = env::namedVariable("GOMP_SPINCOUNT")) {
    s.openMpWait = "GOMP_SPINCOUNT=" + *c;
  } else {
    s.openMpWait = "default";
  }
  s.loadAverage = env::loadAverage().value_or(-1);
  s.fusedOps = models::fusedOpsDescription();
  s.gemm = models::linearGemmDescription();
  return s;
}

bool machineBusy(const ComputeState& s, int cores) { return s.loadAverage >= double(cores); }

std::string describe(const ComputeState& s) {
  return fmt::format(
      "compute: {} intra-op thread(s), {} inter-op; allocator {} ({}); oneDNN {}; LibTorch kernels {}; "
      "memory format {} ({}); profiler observers {}; anomaly detection {}; cores {}{}; OpenMP wait {}; "
      "load average {:.2f}; fused ops {}; linear layers {}; unfolded convolutions {}; CPU {}",
      s.intraOpThreads, s.interOpThreads, s.allocator, s.mallocName, s.onednn ? "on" : "off", s.kernels,
      s.memoryFormat.empty() ? "-" : s.memoryFormat, s.memoryFormatReason,
      s.observers ? "PRESENT" : "none", s.anomalyMode ? "ON" : "off", s.cores,
      s.boundCores ? " (bound)" : "", s.openMpWait, s.loadAverage, s.fusedOps, s.gemm,
      s.convProducts.empty() ? "-" : s.convProducts, cohort::describe(s.cpu));
}

nlohmann::json toJson(const ComputeState& s) {
  return nlohmann::json{{"cpu", s.cpu.model},
                        {"cpu_features", s.cpu.features},
                        {"kernels", s.kernels},
                        {"intra_op_threads", s.intraOpThreads},
                        {"inter_op_threads", s.interOpThreads},
                        {"allocator", s.allocator},
                        {"malloc", s.mallocName},
                        {"malloc_library", s.mallocLibrary},
                        {"onednn", s.onednn},
                        {"bind_cores", s.boundCores},
                        {"cores", s.cores},
                        {"memory_format", s.memoryFormat},
                        {"memory_format_reason", s.memoryFormatReason},
                        {"precision", s.precision},
                        {"precision_reason", s.precisionReason},
                        {"observers", s.observers},
                        {"anomaly_mode", s.anomalyMode},
                        {"grad_mode", s.gradMode},
                        {"openmp_wait", s.openMpWait},
                        {"load_average", s.loadAverage},
                        {"fused_ops", s.fusedOps},
                        {"gemm", s.gemm},
                        {"conv_products", s.convProducts}};
}

namespace {

using Clock = std::chrono::steady_clock;

// One training pass without an update: forward, loss, backward; the
// gradients are dropped again (as zero_grad(set_to_none) would).
double passSeconds(models::Model& model, const at::Tensor& x, const at::Tensor& y, Precision precision) {
  const auto start = Clock::now();
  at::Tensor logits;
  {
    AutocastScope autocast(precision, x.device());
    logits = model.forward(x);
  }
  at::Tensor loss = torch::nn::functional::cross_entropy(logits.to(at::kFloat), y);
  loss.backward();
  auto params = model.parameters();
  // On a GPU the kernels run asynchronously: reading a value of the first
  // layer's gradient (the last one backward computes) waits for all of them.
  if (!params.front().is_cpu() && params.front().grad().defined()) {
    params.front().grad().flatten()[0].item<float>();
  }
  for (auto& p : params) p.mutable_grad() = at::Tensor();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Times both layouts, alternating so that a change in the machine's load
// hits both alike; the fastest pass of each counts. A warm-up pass of each
// first (oneDNN builds its kernels then), then up to kRounds timed rounds,
// fewer once kBudgetS is spent (at least 2; 1 for a model whose passes
// take seconds each).
// Returns the fastest pass of each: {contiguous, channels_last} seconds.
std::array<double, 2> measure(models::Model& model, const at::Tensor& x, const at::Tensor& y,
                              Precision precision) {
  constexpr int kRounds = 4;
  constexpr double kBudgetS = 3.0;
  const bool layouts[2] = {false, true};  // contiguous, channels_last
  double best[2] = {1e300, 1e300};
  double spent = 0;
  for (int round = 0; round <= kRounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      model.setChannelsLast(layouts[k]);
      const double s = passSeconds(model, x, y, precision);
      if (round > 0) best[k] = std::min(best[k], s);
      spent += s;
    }
    if ((round >= 2 && spent > kBudgetS) || (round >= 1 && spent > 4 * kBudgetS)) break;
  }
  return {best[0], best[1]};
}

}  // namespace

MemoryFormatChoice chooseMemoryFormat(models::Model& model, const ModelConfig& config,
                                      int64_t batch, int64_t channels, int64_t height,
                                      int64_t width, const comm::Comm& comm, Precision precision) {
  if (config.memoryFormat != MemoryLayout::automatic) {
    model.setChannelsLast(config.memoryFormat == MemoryLayout::channelsLast);
    return {std::string(choiceName(config.memoryFormat)), "model.memory_format"};
  }
  bool convolutional = false;
  for (const auto& p : model.parameters()) convolutional = convolutional || p.dim() == 4;
  if (!convolutional) {
    model.setChannelsLast(false);
    return {"contiguous", "no convolution weights"};
  }
  const bool preferred = model.channelsLast();
  std::array<double, 2> best{};
  {
    // Leaves the model as it found it: weights are not updated (no
    // optimizer), buffers (BatchNorm statistics) and the generator that
    // drew the batch and drives dropout are put back.
    auto generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor rng = generator.get_state();
    std::vector<at::Tensor> buffers;
    {
      torch::NoGradGuard noGrad;
      for (const auto& b : model.buffers()) buffers.push_back(b.clone());
    }
    const bool wasTraining = model.is_training();
    model.train();
    const auto options = model.parameters().front().options().requires_grad(false);
    const at::Tensor x = torch::randn({batch, channels, height, width}, options);
    const at::Tensor y =
        torch::randint(0, config.numClasses, {batch}, options.dtype(at::kLong));
    best = measure(model, x, y, precision);
    model.train(wasTraining);
    {
      torch::NoGradGuard noGrad;
      auto live = model.buffers();
      for (size_t k = 0; k < live.size(); ++k) live[k].copy_(buffers[k]);
    }
    generator.set_state(rng);
  }
  // Every rank measured, at once, as they will train: the decision takes
  // the mean of their times (one rank's can be noise), and rank 0's
  // verdict is every rank's. The other layout must win by kMargin to
  // replace the preferred one (createModel's): a near tie is noise, and
  // changing the layout changes the kernels and so the last bits of results.
  constexpr double kMargin = 0.03;
  at::Tensor times = torch::tensor({best[0], best[1]}, torch::kFloat64);
  if (comm.worldSize > 1) comm::allreduceSum(comm, times, "memory format times");
  const double contiguous = times[0].item<double>() / comm.worldSize;
  const double channelsLastS = times[1].item<double>() / comm.worldSize;
  const double preferredS = preferred ? channelsLastS : contiguous;
  const double otherS = preferred ? contiguous : channelsLastS;
  const bool channelsLast = otherS < (1 - kMargin) * preferredS ? !preferred : preferred;
  const std::string format = channelsLast ? "channels_last" : "contiguous";
  const std::string reason = fmt::format(
      "measured: contiguous {:.1f} ms, channels_last {:.1f} ms per pass{}", 1000 * contiguous,
      1000 * channelsLastS,
      comm.worldSize > 1 ? fmt::format(", mean of {} ranks", comm.worldSize) : std::string());
  MemoryFormatChoice chosen;
  chosen.format = comm::shareFromRoot(comm, "compute/memory_format", format);
  chosen.reason = comm::shareFromRoot(comm, "compute/memory_format_reason", reason);
  model.setChannelsLast(chosen.format == "channels_last");
  return chosen;
}

}  // namespace cohort::train
