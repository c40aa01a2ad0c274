// Which build of the fused ops' loops runs: the widest the CPU has
// (AVX-512 with F, BW, VL, DQ and FMA; AVX2 with FMA), unless
// ATEN_CPU_CAPABILITY holds LibTorch's kernels to a narrower one ("avx2",
// "default"), which then holds these too. Unset, LibTorch 1.13 runs its own
// kernels' AVX2 builds even on an AVX-512 CPU (at::show_config: "CPU
// capability usage: AVX2"; ATEN_CPU_CAPABILITY=avx512 lifts it).
#include "models/fused_kernels.h"

#include <string>

#include "cohort/core/env.h"

namespace cohort::models::detail {
namespace {

enum class KernelIsa { base, avx2, avx512 };

KernelIsa kernelIsa() {
#if defined(__x86_64__)
  static const KernelIsa chosen = [] {
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const std::string held = env::atenCpuCapability().value_or("");
    if (held == "default") return KernelIsa::base;
    if (avx512 && held != "avx2") return KernelIsa::avx512;
    return avx2 ? KernelIsa::avx2 : KernelIsa::base;
  }();
  return chosen;
#else
  return KernelIsa::base;
#endif
}

template <typename T>
const FusedKernelTable<T>& kernels() {
  switch (kernelIsa()) {
#if defined(__x86_64__)
    case KernelIsa::avx512:
      return isa::avx512(T{});
    case KernelIsa::avx2:
      return isa::avx2(T{});
#endif
    default:
      return isa::base(T{});
  }
}

}  // namespace

const char* fusedKernelsIsa() {
  switch (kernelIsa()) {
    case KernelIsa::avx512:
      return "avx512";
    case KernelIsa::avx2:
      return "avx2";
    default:
      return "base";
  }
}

template <typename T>
void biasGeluForward(const T* h, const T* b, T* y, T* slope, int64_t rows, int64_t n, bool tanh) {
  kernels<T>().biasGeluForward(h, b, y, slope, rows, n, tanh);
}

template <typename T>
void biasGeluBackward(const T* gy, const T* slope, T* gh, T* gb, int64_t rows, int64_t n) {
  kernels<T>().biasGeluBackward(gy, slope, gh, gb, rows, n);
}

template <typename T>
void columnSums(const T* g, T* out, int64_t rows, int64_t n) {
  kernels<T>().columnSums(g, out, rows, n);
}

template <typename T>
void addToRows(T* y, const T* b, int64_t rows, int64_t n) {
  kernels<T>().addToRows(y, b, rows, n);
}

template <typename T>
void addLayerNormForward(const T* x, const T* d, const T* w, const T* b, T* s, T* y, T* mean, T* rstd,
                         int64_t rows, int64_t n, double eps) {
  kernels<T>().addLayerNormForward(x, d, w, b, s, y, mean, rstd, rows, n, eps);
}

template <typename T>
void addLayerNormBackward(const T* gs, const T* gy, const T* s, const T* mean, const T* rstd, const T* w, T* gx,
                          T* gw, T* gb, int64_t rows, int64_t n) {
  kernels<T>().addLayerNormBackward(gs, gy, s, mean, rstd, w, gx, gw, gb, rows, n);
}

template <typename T>
void batchNormStats(const T* x, BnShape shape, T* mean, T* var) {
  kernels<T>().batchNormStats(x, shape, mean, var);
}

template <typename T>
void batchNormReluForward(const T* x, const T* scale, const T* shift, T* y, BnShape shape) {
  kernels<T>().batchNormReluForward(x, scale, shift, y, shape);
}

template <typename T>
void batchNormReluBackward(const T* gy, const T* x, const T* mean, const T* invstd, const T* scale, const T* shift,
                           T* gx, T* gw, T* gb, BnShape shape) {
  kernels<T>().batchNormReluBackward(gy, x, mean, invstd, scale, shift, gx, gw, gb, shape);
}

namespace {

const Bf16KernelTable& bf16Kernels() {
  switch (kernelIsa()) {
#if defined(__x86_64__)
    case KernelIsa::avx512:
      return isa::avx512(Bf16KernelTable::Tag{});
    case KernelIsa::avx2:
      return isa::avx2(Bf16KernelTable::Tag{});
#endif
    default:
      return isa::base(Bf16KernelTable::Tag{});
  }
}

}  // namespace

void causalSoftmaxForward(const c10::BFloat16* x, c10::BFloat16* y, int64_t rows, int64_t q, int64_t t) {
  bf16Kernels().causalSoftmaxForward(x, y, rows, q, t);
}

void causalSoftmaxBackward(const c10::BFloat16* y, const c10::BFloat16* gy, c10::BFloat16* gx, int64_t rows,
                           int64_t q, int64_t t) {
  bf16Kernels().causalSoftmaxBackward(y, gy, gx, rows, q, t);
}

void geluForwardBf16(const c10::BFloat16* h, c10::BFloat16* y, c10::BFloat16* slope, int64_t n, bool tanh) {
  bf16Kernels().geluForward(h, y, slope, n, tanh);
}

void geluBackwardBf16(const c10::BFloat16* gy, const c10::BFloat16* slope, c10::BFloat16* gh, int64_t n) {
  bf16Kernels().geluBackward(gy, slope, gh, n);
}

void addToRowsBf16(c10::BFloat16* y, const float* b, int64_t rows, int64_t n) {
  bf16Kernels().addToRows(y, b, rows, n);
}

void columnSumsBf16(const c10::BFloat16* g, float* out, int64_t rows, int64_t n) {
  bf16Kernels().columnSums(g, out, rows, n);
}

const AttentionKernelTable* attentionKernels() {
  switch (kernelIsa()) {
#if defined(__x86_64__)
    case KernelIsa::avx512:
      return &isa::avx512(AttentionKernelTable::Tag{});
    case KernelIsa::avx2:
      return &isa::avx2(AttentionKernelTable::Tag{});
#endif
    default:
      return nullptr;
  }
}

#define COHORT_FUSED_KERNELS(T)                                                                                   \
  template void biasGeluForward<T>(const T*, const T*, T*, T*, int64_t, int64_t, bool);                          \
  template void biasGeluBackward<T>(const T*, const T*, T*, T*, int64_t, int64_t);                                 \
  template void addLayerNormForward<T>(const T*, const T*, const T*, const T*, T*, T*, T*, T*, int64_t, int64_t,  \
                                       double);                                                                   \
  template void addLayerNormBackward<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*,   \
                                        int64_t, int64_t);                                                        \
  template void batchNormStats<T>(const T*, BnShape, T*, T*);                                                     \
  template void batchNormReluForward<T>(const T*, const T*, const T*, T*, BnShape);                               \
  template void batchNormReluBackward<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*,  \
                                         BnShape);                                                                \
  template void columnSums<T>(const T*, T*, int64_t, int64_t);                                                    \
  template void addToRows<T>(T*, const T*, int64_t, int64_t);
COHORT_FUSED_KERNELS(float)
COHORT_FUSED_KERNELS(double)
#undef COHORT_FUSED_KERNELS

}  // namespace cohort::models::detail
