#pragma once

// How a rank drives LibTorch on the CPU: the settings applied at start-up,
// and the state read back from LibTorch so that summary.json records what
// was in effect (docs/performance.md lists both; a test holds them to it).
//
//   applyCompute(job, localRanks, localRank)  first thing in a rank, before
//                                     tensors: cores, threads, allocator, oneDNN
//   chooseMemoryFormat(...)           after the model is built and on its
//                                     device, before the gradient buckets
//   observeCompute()                  what LibTorch reports now

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "cohort/comm/comm.h"
#include "cohort/config/job.h"
#include "cohort/core/cpu.h"

namespace cohort::models {
class Model;
}

namespace cohort::train {

struct ComputeState {
  CpuInfo cpu;
  std::string kernels;       // LibTorch's CPU kernels: DEFAULT, AVX2 or AVX512
  int intraOpThreads = 0;
  int interOpThreads = 0;
  std::string allocator;     // keep | map | system (as applied by applyCompute)
  std::string mallocName;    // glibc | tcmalloc | jemalloc | other: what serves malloc (env::servingMalloc)
  std::string mallocLibrary;
  bool onednn = false;       // convolutions through oneDNN
  bool boundCores = false;   // compute.bind_cores held this rank to `cores`
  std::string cores;         // the cores this rank's threads may run on ("0-3")
  std::string memoryFormat;  // channels_last | contiguous (after chooseMemoryFormat)
  std::string memoryFormatReason;
  std::string precision;     // fp32 | bf16 (training.precision resolved)
  std::string precisionReason;
  bool observers = false;    // RecordFunction callbacks (a profiler) registered
  bool anomalyMode = false;  // autograd's anomaly detection
  bool gradMode = true;
  // How idle OpenMP threads wait: "GOMP_SPINCOUNT=10000" as cohort's
  // launchers set it (core/env.h, rankOpenMpWait), the user's
  // OMP_WAIT_POLICY or GOMP_SPINCOUNT, or "default" (GNU OpenMP's own).
  std::string openMpWait;
  double loadAverage = -1;  // the machine's 1-minute load average as training started; -1: unknown
  std::string fusedOps;     // the fused training ops: avx512 | avx2 | off (why) (models/fused_ops.h)
  std::string gemm;         // linear layers' float32 products: onednn | aten (why) (models/linear.h)
  // Convolutions as products over the unfolded input (models/gemm_conv.h),
  // chosen per shape by chooseConvProducts: "none", or how many shapes
  // measured faster so and which did not.
  std::string convProducts;
};

// Whether other work already fills the cores a rank may use: the load
// average as the rank started is at least their number.
bool machineBusy(const ComputeState& s, int cores);

// Binds the process to its cores (compute.bind_cores, train/bind_cores.h:
// local rank `localRank` of `localRanks`), then sets the intra-op threads
// (distribution.threads_per_rank, 0: cores / `localRanks`), one inter-op
// thread, the allocator policy
// (compute.allocator: glibc's; with another allocator preloaded it is left
// alone) and oneDNN's use (compute.onednn). Logs nothing;
// observeCompute() tells. Throws ConfigError for onednn: on when LibTorch was
// built without it.
void applyCompute(const JobConfig& job, int localRanks, int localRank = 0);

// keepFreedMemory() and mapLargeBlocks(), the allocator policies, are
// core/malloc_policy.h's.

// model.memory_format: channels_last or contiguous as the job says; auto:
// every rank times a few forward+backward passes of `model` in each layout
// on a random batch of `batch` samples; the mean of all ranks' times decides
// (they must agree: the gradient buckets follow the weights' strides). The
// model's weights, buffers, gradients and the CPU generator's state are as
// before. The passes run in `precision` (fp32 or bf16), as training will:
// the faster layout is not the same in both. Returns the layout and why it
// was chosen.
struct MemoryFormatChoice {
  std::string format;
  std::string reason;
};
MemoryFormatChoice chooseMemoryFormat(models::Model& model, const ModelConfig& config,
                                      int64_t batch, int64_t channels, int64_t height,
                                      int64_t width, const comm::Comm& comm,
                                      Precision precision);

// Which convolutions run as products over their unfolded input
// (models/gemm_conv.h), chosen per shape by measurement: one forward pass
// of `model` on a random batch of `batch` samples (eval mode, no
// gradients) records the shapes the rule takes; every rank times each
// both ways (forward and backward, 3 rounds after a warm-up); the mean of
// all ranks' times decides, the same on every rank: unfolded where it is
// 3% faster than the module's convolution, the convolution otherwise.
// Shapes met later that were not measured (another batch size) follow the
// rule. Buffers, gradients and the CPU generator are left as they were.
// Training calls it when model.memory_format is auto and the model is
// whole (not a pipeline stage); otherwise the rule decides everywhere.
// Returns what summary.json's compute.conv_products says.
std::string chooseConvProducts(models::Model& model, int64_t batch, int64_t channels, int64_t height,
                               int64_t width, const comm::Comm& comm, Precision precision);

// The state in effect now (threads, oneDNN, observers, ...), with the
// allocator policy last applied; memoryFormat is left empty.
// applyCompute also fits oneDNN to the precision: PyTorch sends bf16
// convolutions and matrix products to oneDNN whenever the CPU has AVX-512
// (BW, VL, DQ), and oneDNN held below AVX-512 (ONEDNN_MAX_CPU_ISA or
// DNNL_MAX_CPU_ISA of SSE41, AVX, AVX2 or AVX2_VNNI) has no bf16 kernels:
// every such call would fail ("could not create a primitive descriptor
// iterator"). Then, with compute.onednn auto, LibTorch's own kernels run
// (oneDNN off, as on a CPU without AVX-512), and oneDnnNote() is the line
// that says so ("" otherwise); with compute.onednn on it throws ConfigError.
const std::string& oneDnnNote();

ComputeState observeCompute();

// One line for the log, and the object summary.json's "compute" holds.
std::string describe(const ComputeState& s);
nlohmann::json toJson(const ComputeState& s);

}  // namespace cohort::train
