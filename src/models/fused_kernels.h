#pragma once

// The loops of the fused training ops (models/fused_ops.h) over raw,
// dense memory: float or double, the caller having checked dtypes, sizes
// and layouts. Each runs on LibTorch's intra-op threads (at::parallel_for).
// Reductions over rows are cut into blocks of a fixed number of rows,
// summed in block order: the same inputs give the same bits whatever the
// number of threads. Each loop is built for the baseline, AVX2 and
// AVX-512 (models/detail/fused_kernels_impl.h); the calls below take the
// widest build the CPU runs, or the narrower one ATEN_CPU_CAPABILITY holds
// LibTorch's kernels to (models/fused_kernels.cc).

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace cohort::models::detail {

// y = gelu(h + b) over `rows` rows of `n` (b may be null: gelu(h)), and,
// when slope is not null, slope = gelu'(h + b), computed in the same pass for
// the backward; tanh: GELU's tanh approximation. Float32's exact GELU takes
// erf from the polynomial oneDNN's gelu_erf (ATen's float32 CPU gelu)
// computes, |error| <= 1.5e-7.
template <typename T>
void biasGeluForward(const T* h, const T* b, T* y, T* slope, int64_t rows, int64_t n, bool tanh);

// gh = gy * slope; gb (when not null) = gh summed over the rows.
template <typename T>
void biasGeluBackward(const T* gy, const T* slope, T* gh, T* gb, int64_t rows, int64_t n);

// s = x + d; y = (s - mean) * rstd * w + b (b may be null), per row of `n`;
// mean and rstd (one per row) kept for the backward.
template <typename T>
void addLayerNormForward(const T* x, const T* d, const T* w, const T* b, T* s, T* y, T* mean, T* rstd,
                         int64_t rows, int64_t n, double eps);

// gx = gs + LayerNorm's input gradient from gy; gw, gb (either may be null):
// the weight's and bias's gradients.
template <typename T>
void addLayerNormBackward(const T* gs, const T* gy, const T* s, const T* mean, const T* rstd, const T* w, T* gx,
                          T* gw, T* gb, int64_t rows, int64_t n);

// A linear layer's bias over `rows` rows of `n` (models/linear.cc):
// out = g summed over the rows (its gradient from the output's; blocks of
// rows as above), and y += b on every row (ATen's y.add_(b), bitwise).
template <typename T>
void columnSums(const T* g, T* out, int64_t rows, int64_t n);
template <typename T>
void addToRows(T* y, const T* b, int64_t rows, int64_t n);

// A batch of images [n, c, hw] (channels-first) or [n, hw, c] (channels-last).
struct BnShape {
  int64_t n = 0, c = 0, hw = 0;
  bool channelsLast = false;
};

// Per channel: the mean and the biased variance over n * hw values.
template <typename T>
void batchNormStats(const T* x, BnShape shape, T* mean, T* var);

// y = max(x * scale + shift, 0), per channel's scale and shift.
template <typename T>
void batchNormReluForward(const T* x, const T* scale, const T* shift, T* y, BnShape shape);

// BatchNorm's training backward with the gradient gy masked where
// x * scale + shift <= 0 (the ReLU's), as forward computed it: gx, and
// the weight's and bias's gradients gw, gb.
template <typename T>
void batchNormReluBackward(const T* gy, const T* x, const T* mean, const T* invstd, const T* scale, const T* shift,
                           T* gx, T* gw, T* gb, BnShape shape);

// Softmax over each of `rows` rows of t values, the rows of [.., q, t]
// causal attention scores in bfloat16 whose q queries are the last q of
// the t positions (q <= t; q = t: square): row r keeps its first
// t - q + r % q + 1 values (its query sees the keys up to its own
// position) and the others become 0, whatever they held. Computed in
// float32; the row maximum and exp are models/softmax_rows.h's.
void causalSoftmaxForward(const c10::BFloat16* x, c10::BFloat16* y, int64_t rows, int64_t q, int64_t t);

// The softmax's input gradient from its output y and output gradient gy:
// gx = y * (gy - sum(y * gy)) over each row's kept values, 0 after them.
void causalSoftmaxBackward(const c10::BFloat16* y, const c10::BFloat16* gy, c10::BFloat16* gx, int64_t rows,
                           int64_t q, int64_t t);

// y = gelu(h) over n bfloat16 values and, when slope is not null, slope =
// gelu'(h), each computed in float32 as biasGeluForward computes them and
// rounded once; tanh: GELU's tanh approximation.
void geluForwardBf16(const c10::BFloat16* h, c10::BFloat16* y, c10::BFloat16* slope, int64_t n, bool tanh);

// gh = gy * slope over n bfloat16 values (the product in float32).
void geluBackwardBf16(const c10::BFloat16* gy, const c10::BFloat16* slope, c10::BFloat16* gh, int64_t n);

// A linear layer's float32 bias on a bfloat16 product (models/linear.cc,
// under autocast), over `rows` rows of `n`: y += b on every row, in float32
// and rounded once (ATen's y.add_(b), bitwise); out = g summed over the
// rows in float32 (blocks of rows as columnSums), the bias's gradient
// without a bfloat16 rounding between.
void addToRowsBf16(c10::BFloat16* y, const float* b, int64_t rows, int64_t n);
void columnSumsBf16(const c10::BFloat16* g, float* out, int64_t rows, int64_t n);

// The bfloat16 loops of one instruction set's build.
struct Bf16KernelTable {
  struct Tag {};
  void (*causalSoftmaxForward)(const c10::BFloat16*, c10::BFloat16*, int64_t, int64_t, int64_t);
  void (*causalSoftmaxBackward)(const c10::BFloat16*, const c10::BFloat16*, c10::BFloat16*, int64_t, int64_t,
                                int64_t);
  void (*geluForward)(const c10::BFloat16*, c10::BFloat16*, c10::BFloat16*, int64_t, bool);
  void (*geluBackward)(const c10::BFloat16*, const c10::BFloat16*, c10::BFloat16*, int64_t);
  void (*addToRows)(c10::BFloat16*, const float*, int64_t, int64_t);
  void (*columnSums)(const c10::BFloat16*, float*, int64_t, int64_t);
};

// The blockwise attention's float32 products and transposes
// (models/detail/attention_kernels_impl.h), built for AVX2 and AVX-512 only.
struct AttentionKernelTable {
  struct Tag {};
  // C[m x n] = alpha * A B + beta * C, A(i, p) at a[i * ars + p * acs] (A
  // transposed: the strides swapped), B's rows ldb apart, C's ldc apart;
  // beta 0 never reads C.
  void (*product)(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t ars, int64_t acs,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
  // y[c * ldy + r] = x[r * ldx + c] for r < rows, c < cols.
  void (*transpose)(const float* x, int64_t ldx, int64_t rows, int64_t cols, float* y, int64_t ldy);
  // Over a block of scores [rows x cols] (rows lds or ld apart) whose row r
  // keeps its first clamp(diag + r + 1, 0, cols) values (the causal mask)
  // and holds 0 in the others afterwards; exp is models/softmax_rows.h's.
  // The forward's online softmax: per row, the running maximum m and sum l
  // take in the kept scores, which become exp(s - m), and the row's nd
  // outputs in acc are scaled by exp(old m - new m).
  void (*softmaxBlock)(float* s, int64_t lds, int64_t rows, int64_t cols, int64_t diag, float* m, float* l,
                       float* acc, int64_t nd);
  // The backward's probabilities: p = exp(p - shift[r]).
  void (*expBlock)(float* p, int64_t ldp, int64_t rows, int64_t cols, int64_t diag, const float* shift);
  // The scores' gradient from the probabilities': ds = p * (ds - d[r]).
  void (*scoreGradBlock)(float* ds, const float* p, int64_t ld, int64_t rows, int64_t cols, const float* d);
};

// How many of row r's cols scores a block keeps under the causal mask
// (AttentionKernelTable: diag = the block's first query - its first key).
inline int64_t causalKept(int64_t r, int64_t diag, int64_t cols) {
  return diag + r + 1 < 0 ? 0 : (diag + r + 1 > cols ? cols : diag + r + 1);
}

// The widest build's AttentionKernelTable (as the calls above choose), or null
// where that is the baseline.
const AttentionKernelTable* attentionKernels();

// The loops of one instruction set's build, for one dtype.
template <typename T>
struct FusedKernelTable {
  void (*biasGeluForward)(const T*, const T*, T*, T*, int64_t, int64_t, bool);
  void (*biasGeluBackward)(const T*, const T*, T*, T*, int64_t, int64_t);
  void (*addLayerNormForward)(const T*, const T*, const T*, const T*, T*, T*, T*, T*, int64_t, int64_t, double);
  void (*addLayerNormBackward)(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*, int64_t,
                               int64_t);
  void (*batchNormStats)(const T*, BnShape, T*, T*);
  void (*batchNormReluForward)(const T*, const T*, const T*, T*, BnShape);
  void (*batchNormReluBackward)(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*, BnShape);
  void (*columnSums)(const T*, T*, int64_t, int64_t);
  void (*addToRows)(T*, const T*, int64_t, int64_t);
};

// The build the calls above take: "avx512", "avx2" or "base".
const char* fusedKernelsIsa();

// Each build's table (the argument picks the dtype); avx2 and avx512 exist
// on x86-64 only, and run only on a CPU that has the instructions.
namespace isa {
const FusedKernelTable<float>& base(float);
const FusedKernelTable<double>& base(double);
const Bf16KernelTable& base(Bf16KernelTable::Tag);
#if defined(__x86_64__)
const FusedKernelTable<float>& avx2(float);
const FusedKernelTable<double>& avx2(double);
const Bf16KernelTable& avx2(Bf16KernelTable::Tag);
const AttentionKernelTable& avx2(AttentionKernelTable::Tag);
const FusedKernelTable<float>& avx512(float);
const FusedKernelTable<double>& avx512(double);
const Bf16KernelTable& avx512(Bf16KernelTable::Tag);
const AttentionKernelTable& avx512(AttentionKernelTable::Tag);
#endif
}  // namespace isa

}  // namespace cohort::models::detail
