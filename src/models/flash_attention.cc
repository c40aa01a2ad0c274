#include "models/flash_attention.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <cblas.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "models/fused_kernels.h"
#include "models/softmax_rows.h"

namespace cohort::models {
namespace {
// Named apart from the other files of a unity batch (src/CMakeLists.txt).
namespace flash {

// Rows of queries and of keys per block: a block's scores (64 x 64 floats,
// 16 KB) and its output rows stay in L1/L2 while the keys stream past. The
// two are equal, so that a block of keys starts where a block of queries
// does and the diagonal crosses one block of each row of blocks.
constexpr int64_t kBlock = 64;

// -1 unset (read COHORT_ATTENTION on first use), 0 blockwise, 1 matmul only.
std::atomic<int> matmulOnlyState{-1};

// Row-major C = alpha op(A) op(B) + beta C through BLAS (the OpenBLAS
// LibTorch itself links): float64, and float32 on a CPU without AVX2 (or
// held to the baseline). Called from inside at::parallel_for's threads,
// where OpenBLAS's OpenMP build runs single-threaded.
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// x[i] = exp(x[i] - shift) for x[i] <= shift, and their sum: float32
// through the row kernels (models/softmax_rows.h), float64 with std::exp.
float expInPlace(float* x, int64_t n, float shift) { return detail::expShiftedInPlace(x, n, shift); }
double expInPlace(double* x, int64_t n, double shift) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

// The largest of x[0..n).
float rowMax(const float* x, int64_t n) { return detail::rowMax(x, n); }
double rowMax(const double* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

using at::vec::Vectorized;

// x[i] *= a.
template <class T>
void scaleRow(T* x, int64_t n, T a) {
  using V = Vectorized<T>;
  const V va(a);
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) (V::loadu(x + i) * va).store(x + i);
  for (; i < n; ++i) x[i] *= a;
}

// y[i] = x[i] * a (y and x of n elements).
template <class T>
void scaledCopy(T* y, const T* x, int64_t n, T a) {
  using V = Vectorized<T>;
  const V va(a);
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) (V::loadu(x + i) * va).store(y + i);
  for (; i < n; ++i) y[i] = x[i] * a;
}

// ds[i] = p[i] * (ds[i] - d): the gradient of the scores from the
// probabilities p and the gradient of the probabilities (in ds).
template <class T>
void scoreGrad(T* ds, const T* p, int64_t n, T d) {
  using V = Vectorized<T>;
  const V vd(d);
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) (V::loadu(p + i) * (V::loadu(ds + i) - vd)).store(ds + i);
  for (; i < n; ++i) ds[i] = p[i] * (ds[i] - d);
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  using V = Vectorized<T>;
  V acc(T(0));
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) acc = at::vec::fmadd(V::loadu(a + i), V::loadu(b + i), acc);
  T lanes[V::size()];
  acc.store(lanes);
  T s = 0;
  for (int64_t j = 0; j < V::size(); ++j) s += lanes[j];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// A transposed copy of rows, [d x ld]: column c onwards (none when the
// steps are not tiled, and nothing was copied).
template <class T>
struct Transposed {
  std::vector<T> data;
  int64_t ld = 0;
  const T* from(int64_t c) const { return data.empty() ? nullptr : data.data() + c; }
};

// The steps over blocks: float32 through the attention kernels of the
// widest build (models/detail/attention_kernels_impl.h), whose products
// read A in place whatever its strides and B's rows in place, so a product
// with B transposed (Q K^T, dOut V^T) reads a transposed copy of B's rows
// that the kernel keeps per (batch, head); float64 and the baseline build
// through BLAS and the loops above (docs/performance.md).
template <class T>
struct BlockSteps {
  const detail::AttentionKernelTable* tiles = nullptr;

  static BlockSteps forThisCpu() {
    BlockSteps p;
    // COHORT_ATTENTION=blas: the way before the block steps, to compare.
    static const bool blas = env::attentionBlasBlocks();
    if constexpr (std::is_same_v<T, float>) p.tiles = blas ? nullptr : detail::attentionKernels();
    return p;
  }
  bool tiled() const { return tiles != nullptr; }
  // C = alpha A B^T + beta C: B's [n x k] rows at b, or (tiled) B^T's
  // [k x n] rows from column `col` of bT.
  void abT(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb,
           const Transposed<T>& bT, int64_t col, T beta, T* c, int64_t ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      if (tiles) return tiles->product(m, n, k, alpha, a, lda, 1, bT.from(col), bT.ld, beta, c, ldc);
    }
    gemm(false, true, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  // C = alpha A B + beta C.
  void ab(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
          int64_t ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      if (tiles) return tiles->product(m, n, k, alpha, a, lda, 1, b, ldb, beta, c, ldc);
    }
    gemm(false, false, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  // C = alpha A^T B + beta C, A's [k x m] rows at a.
  void aTb(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
           int64_t ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      if (tiles) return tiles->product(m, n, k, alpha, a, 1, lda, b, ldb, beta, c, ldc);
    }
    gemm(true, false, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  // Room for nt rows of d transposed (tiled only): rows nt rounded up to
  // 16, plus 16, apart, so that a long sequence's rows are not a power of
  // two apart (rows 2 KB apart share few L1 sets and evict one another
  // within a product).
  Transposed<T> transposedFor(int64_t nt, int64_t d) const {
    Transposed<T> t;
    if (!tiled()) return t;
    t.ld = (nt + 15) / 16 * 16 + 16;
    t.data.resize(d * t.ld);
    return t;
  }
  // Rows [from, to) of x (rows of d, ld apart) into columns [from, to) of y.
  void transposeRows(const T* x, int64_t ld, int64_t from, int64_t to, int64_t d, Transposed<T>& y) const {
    if constexpr (std::is_same_v<T, float>) {
      if (tiles && to > from) tiles->transpose(x + from * ld, ld, to - from, d, y.data.data() + from, y.ld);
    }
  }
  // Over a block of scores [rows x cols] whose row r keeps its first
  // clamp(diag + r + 1, 0, cols) values (the causal mask; 0 in the others
  // afterwards): the forward's online softmax step, the running maximum m
  // and sum l per row, the rows' nd outputs in acc rescaled.
  void softmax(T* s, int64_t lds, int64_t rows, int64_t cols, int64_t diag, T* m, T* l, T* acc, int64_t nd) const {
    if constexpr (std::is_same_v<T, float>) {
      if (tiles) return tiles->softmaxBlock(s, lds, rows, cols, diag, m, l, acc, nd);
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* row = s + r * lds;
      const int64_t kept = detail::causalKept(r, diag, cols);
      const T mx = std::max(m[r], rowMax(row, kept));
      const T sum = expInPlace(row, kept, mx);
      std::fill(row + kept, row + cols, T(0));
      // The first block's correction multiplies zeros: exp(-inf) = 0.
      const T correction = m[r] == mx ? T(1) : std::exp(m[r] - mx);
      if (correction != T(1)) scaleRow(acc + r * nd, nd, correction);
      l[r] = l[r] * correction + sum;
      m[r] = mx;
    }
  }
  // The backward's probabilities from the scores: exp(p - shift[r]).
  void probabilities(T* p, int64_t ldp, int64_t rows, int64_t cols, int64_t diag, const T* shift) const {
    if constexpr (std::is_same_v<T, float>) {
      if (tiles) return tiles->expBlock(p, ldp, rows, cols, diag, shift);
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* row = p + r * ldp;
      const int64_t kept = detail::causalKept(r, diag, cols);
      expInPlace(row, kept, shift[r]);
      std::fill(row + kept, row + cols, T(0));
    }
  }
  // The scores' gradient from the probabilities' (in ds): p (ds - d[r]).
  void scoreGradient(T* ds, const T* p, int64_t ld, int64_t rows, int64_t cols, const T* d) const {
    if constexpr (std::is_same_v<T, float>) {
      if (tiles) return tiles->scoreGradBlock(ds, p, ld, rows, cols, d);
    }
    for (int64_t r = 0; r < rows; ++r) scoreGrad(ds + r * ld, p + r * ld, cols, d[r]);
  }
};

// One of q, k, v (or a gradient) as rows of D contiguous elements: element
// (b, h, t, d) at p[b * sB + h * sH + t * ld + d].
template <class T>
struct Rows {
  T* p;
  int64_t sB, sH, ld;
  T* at(int64_t b, int64_t h, int64_t t) const { return p + b * sB + h * sH + t * ld; }
};

// A [B, H, T, D] tensor whose rows BLAS can read in place (unit stride along
// D, rows apart by at least D); otherwise a contiguous copy.
at::Tensor readable(const at::Tensor& x) {
  const int64_t t = x.size(2), d = x.size(3);
  const bool unit = d == 1 || x.stride(3) == 1;
  const bool rows = t == 1 || x.stride(2) >= d;
  return unit && rows ? x : x.contiguous();
}

template <class T>
Rows<T> rowsOf(const at::Tensor& x) {
  const int64_t d = x.size(3);
  return {const_cast<T*>(x.data_ptr<T>()), x.stride(0), x.stride(1), x.size(2) == 1 ? d : x.stride(2)};
}

// Rows of an output laid out [B, T, H, D] (the [B, T, H D] the model
// projects next).
template <class T>
Rows<T> headRows(T* p, int64_t t, int64_t h, int64_t d) {
  return {p, t * h * d, d, h * d};
}

// Rows of a [B, T, H, D] view with unit stride along D.
template <class T>
Rows<T> rowsOfBthd(const at::Tensor& x) {
  return {const_cast<T*>(x.data_ptr<T>()), x.stride(0), x.stride(2), x.stride(1)};
}

template <class T>
void forwardKernel(const Rows<T>& q, const Rows<T>& k, const Rows<T>& v, const Rows<T>& out, T* lse, int64_t nb,
                   int64_t nh, int64_t nt, int64_t nd) {
  const T scale = T(1) / std::sqrt(static_cast<T>(nd));
  const int64_t blocks = (nt + kBlock - 1) / kBlock;
  // Tasks in (batch, head, query block) order: a thread's contiguous range
  // of them costs about the same as another's.
  const BlockSteps<T> steps = BlockSteps<T>::forThisCpu();
  at::parallel_for(0, nb * nh * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> s(kBlock * kBlock), acc(kBlock * nd), m(kBlock), l(kBlock);
    // The keys of one (batch, head) transposed, those before
    // kUpTo done: a thread's tasks come in order, so each key is
    // transposed about once.
    Transposed<T> kT = steps.transposedFor(nt, nd);
    int64_t kOf = -1, kUpTo = 0;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / blocks, q0 = (task % blocks) * kBlock;
      const int64_t b = bh / nh, h = bh % nh, nq = std::min(kBlock, nt - q0);
      const T* qp = q.at(b, h, q0);
      if (bh != kOf) {
        kOf = bh;
        kUpTo = 0;
      }
      steps.transposeRows(k.at(b, h, 0), k.ld, kUpTo, std::max(kUpTo, q0 + nq), nd, kT);
      kUpTo = std::max(kUpTo, q0 + nq);
      std::fill(acc.begin(), acc.begin() + nq * nd, T(0));
      std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
      std::fill(l.begin(), l.end(), T(0));
      // Keys 0 .. q0 + nq - 1: the blocks above the diagonal are never touched.
      for (int64_t k0 = 0; k0 < q0 + nq; k0 += kBlock) {
        const int64_t nk = std::min(kBlock, q0 + nq - k0);
        steps.abT(nq, nk, nd, scale, qp, q.ld, k.at(b, h, k0), k.ld, kT, k0, T(0), s.data(), kBlock);
        // Keys after query q0 + r are masked: only the diagonal block has any.
        steps.softmax(s.data(), kBlock, nq, nk, q0 - k0, m.data(), l.data(), acc.data(), nd);
        steps.ab(nq, nd, nk, T(1), s.data(), kBlock, v.at(b, h, k0), v.ld, T(1), acc.data(), nd);
      }
      for (int64_t r = 0; r < nq; ++r) {
        scaledCopy(out.at(b, h, q0 + r), acc.data() + r * nd, nd, T(1) / l[r]);
        lse[bh * nt + q0 + r] = m[r] + std::log(l[r]);
      }
    }
  });
}

// Blocks of keys outside, blocks of queries inside: one (batch, head) per
// task, so that its dq, dk and dv rows have one writer and no thread waits
// on another. dq, dk and dv may hold anything: each row is written before
// it is added to.
template <class T>
void backwardKernel(const Rows<T>& q, const Rows<T>& k, const Rows<T>& v, const Rows<T>& out, const T* lse,
                    const Rows<T>& dOut, const Rows<T>& dq, const Rows<T>& dk, const Rows<T>& dv, int64_t nb,
                    int64_t nh, int64_t nt, int64_t nd) {
  const T scale = T(1) / std::sqrt(static_cast<T>(nd));
  const BlockSteps<T> steps = BlockSteps<T>::forThisCpu();
  at::parallel_for(0, nb * nh, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> p(kBlock * kBlock), ds(kBlock * kBlock), dkAcc(kBlock * nd), dvAcc(kBlock * nd), rowDot(nt);
    // The keys and values transposed (tiled only).
    Transposed<T> kT = steps.transposedFor(nt, nd), vT = steps.transposedFor(nt, nd);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / nh, h = bh % nh;
      const T* rowLse = lse + bh * nt;
      steps.transposeRows(k.at(b, h, 0), k.ld, 0, nt, nd, kT);
      steps.transposeRows(v.at(b, h, 0), v.ld, 0, nt, nd, vT);
      // dOut . out per row: the softmax's backward subtracts it.
      for (int64_t t = 0; t < nt; ++t) rowDot[t] = dot(dOut.at(b, h, t), out.at(b, h, t), nd);
      for (int64_t k0 = 0; k0 < nt; k0 += kBlock) {
        const int64_t nk = std::min(kBlock, nt - k0);
        const T* kp = k.at(b, h, k0);
        const T* vp = v.at(b, h, k0);
        std::fill(dkAcc.begin(), dkAcc.end(), T(0));
        std::fill(dvAcc.begin(), dvAcc.end(), T(0));
        // Queries from k0 on: the earlier ones never see these keys.
        for (int64_t q0 = k0; q0 < nt; q0 += kBlock) {
          const int64_t nq = std::min(kBlock, nt - q0);
          const T* qp = q.at(b, h, q0);
          const T* dop = dOut.at(b, h, q0);
          steps.abT(nq, nk, nd, scale, qp, q.ld, kp, k.ld, kT, k0, T(0), p.data(), kBlock);
          steps.probabilities(p.data(), kBlock, nq, nk, q0 - k0, rowLse + q0);
          steps.aTb(nk, nd, nq, T(1), p.data(), kBlock, dop, dOut.ld, T(1), dvAcc.data(), nd);
          steps.abT(nq, nk, nd, T(1), dop, dOut.ld, vp, v.ld, vT, k0, T(0), ds.data(), kBlock);
          steps.scoreGradient(ds.data(), p.data(), kBlock, nq, nk, rowDot.data() + q0);
          // The first block of keys (k0 = 0, which every query block sees)
          // writes dq; the others add to it.
          steps.ab(nq, nd, nk, scale, ds.data(), kBlock, kp, k.ld, k0 == 0 ? T(0) : T(1), dq.at(b, h, q0), dq.ld);
          steps.aTb(nk, nd, nq, scale, ds.data(), kBlock, qp, q.ld, T(1), dkAcc.data(), nd);
        }
        for (int64_t r = 0; r < nk; ++r) {
          std::copy_n(dkAcc.data() + r * nd, nd, dk.at(b, h, k0 + r));
          std::copy_n(dvAcc.data() + r * nd, nd, dv.at(b, h, k0 + r));
        }
      }
    }
  });
}

bool matmulOnly() {
  int state = matmulOnlyState.load(std::memory_order_relaxed);
  if (state < 0) {
    state = env::attentionMatmulOnly() ? 1 : 0;
    matmulOnlyState.store(state, std::memory_order_relaxed);
  }
  return state == 1;
}

// One projection's q, k, v side by side (models/flash_attention.h,
// flashAttentionPacked): float32 or float64 only (flashAttentionApplies).
class FlashAttentionPackedFunction : public torch::autograd::Function<FlashAttentionPackedFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv, int64_t heads) {
    const at::Tensor whole = qkv.contiguous();
    const auto [q, k, v] = headsOf(whole, heads);
    auto [out, lse] = detail::flashForward(q, k, v);
    ctx->save_for_backward({whole, out, lse});
    ctx->saved_data["heads"] = heads;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& whole = saved[0];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t b = whole.size(0), t = whole.size(1), c = whole.size(2) / 3;
    const auto [q, k, v] = headsOf(whole, heads);
    // [B, T, 3, H, D]: dq, dk, dv where q, k, v are in qkv.
    at::Tensor g = at::empty({b, t, 3, heads, c / heads}, whole.options());
    detail::flashBackwardInto(q, k, v, saved[1], saved[2], grads[0], g.select(2, 0), g.select(2, 1), g.select(2, 2));
    return {g.view({b, t, 3 * c}), at::Tensor()};
  }
};

class FlashAttentionFunction : public torch::autograd::Function<FlashAttentionFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v) {
    auto [out, lse] = detail::flashForward(compute(q), compute(k), compute(v));
    // bfloat16 inputs: the float output is kept for backward, whose row
    // dots would otherwise see it rounded.
    ctx->save_for_backward({q, k, v, out, lse});
    return out.to(q.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& q = saved[0];
    auto [dq, dk, dv] = detail::flashBackward(compute(q), compute(saved[1]), compute(saved[2]), saved[3], saved[4],
                                              grads[0].to(saved[3].scalar_type()));
    return {dq.to(q.scalar_type()), dk.to(q.scalar_type()), dv.to(q.scalar_type())};
  }

 private:
  // bfloat16 is computed in float32.
  static at::Tensor compute(const at::Tensor& x) {
    return x.scalar_type() == at::kBFloat16 ? x.to(at::kFloat) : x;
  }
};

}  // namespace flash
}  // namespace

using flash::FlashAttentionFunction;
using flash::FlashAttentionPackedFunction;

bool flashAttentionTakes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const at::ScalarType t = q.scalar_type();
  return (t == at::kFloat || t == at::kDouble || t == at::kBFloat16) && k.scalar_type() == t &&
         v.scalar_type() == t && q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() && q.dim() == 4 &&
         k.sizes() == q.sizes() && v.sizes() == q.sizes();
}

bool flashAttentionApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return q.scalar_type() != at::kBFloat16 && flashAttentionTakes(q, k, v) && !flash::matmulOnly();
}

std::array<at::Tensor, 3> headsOf(const at::Tensor& qkv, int64_t heads) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  auto part = [&](int64_t i) { return qkv.narrow(2, i * c, c).view({b, t, heads, c / heads}).transpose(1, 2); };
  return {part(0), part(1), part(2)};
}

bool flashAttentionPackedApplies(const at::Tensor& qkv, int64_t heads) {
  if (qkv.dim() != 3 || heads <= 0 || qkv.size(2) % (3 * heads) != 0 || qkv.size(2) == 0) return false;
  const auto [q, k, v] = headsOf(qkv, heads);  // splitting a dimension is a view at any strides
  return flashAttentionApplies(q, k, v);
}

at::Tensor flashAttentionPacked(const at::Tensor& qkv, int64_t heads) {
  COHORT_ASSERT(flashAttentionPackedApplies(qkv, heads), "flashAttentionPacked: qkv ", qkv.sizes(), " ",
                qkv.scalar_type(), ", ", heads, " heads");
  return FlashAttentionPackedFunction::apply(qkv, heads);
}

void setAttentionMatmulOnly(bool only) { flash::matmulOnlyState.store(only ? 1 : 0, std::memory_order_relaxed); }

at::Tensor flashAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  COHORT_ASSERT(flashAttentionTakes(q, k, v), "flashAttention: q ", q.sizes(), " ", q.scalar_type(), ", k ",
                k.sizes(), ", v ", v.sizes());
  return FlashAttentionFunction::apply(q, k, v);
}

namespace detail {

std::pair<at::Tensor, at::Tensor> flashForward(const at::Tensor& qIn, const at::Tensor& kIn, const at::Tensor& vIn) {
  const at::Tensor q = flash::readable(qIn), k = flash::readable(kIn), v = flash::readable(vIn);
  const int64_t nb = q.size(0), nh = q.size(1), nt = q.size(2), nd = q.size(3);
  at::Tensor out = at::empty({nb, nt, nh * nd}, q.options());
  at::Tensor lse = at::empty({nb, nh, nt}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "flashForward", [&] {
    using flash::rowsOf;
    flash::forwardKernel<scalar_t>(rowsOf<scalar_t>(q), rowsOf<scalar_t>(k), rowsOf<scalar_t>(v),
                                   flash::headRows(out.data_ptr<scalar_t>(), nt, nh, nd), lse.data_ptr<scalar_t>(),
                                   nb, nh, nt, nd);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flashBackward(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, const at::Tensor& out,
                                                             const at::Tensor& lse, const at::Tensor& dOut) {
  const int64_t nb = q.size(0), nh = q.size(1), nt = q.size(2), nd = q.size(3);
  // Laid out [B, T, H, D] as the model's q, k, v are (views of one
  // projection), returned as [B, H, T, D] views.
  at::Tensor dq = at::empty({nb, nt, nh, nd}, q.options());
  at::Tensor dk = at::empty({nb, nt, nh, nd}, q.options());
  at::Tensor dv = at::empty({nb, nt, nh, nd}, q.options());
  flashBackwardInto(q, k, v, out, lse, dOut, dq, dk, dv);
  return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)};
}

void flashBackwardInto(const at::Tensor& qIn, const at::Tensor& kIn, const at::Tensor& vIn, const at::Tensor& outIn,
                       const at::Tensor& lseIn, const at::Tensor& dOutIn, const at::Tensor& dq, const at::Tensor& dk,
                       const at::Tensor& dv) {
  const at::Tensor q = flash::readable(qIn), k = flash::readable(kIn), v = flash::readable(vIn);
  const at::Tensor out = outIn.contiguous(), lse = lseIn.contiguous(), dOut = dOutIn.contiguous();
  const int64_t nb = q.size(0), nh = q.size(1), nt = q.size(2), nd = q.size(3);
  for (const at::Tensor* g : {&dq, &dk, &dv}) {
    COHORT_ASSERT(g->dim() == 4 && g->size(0) == nb && g->size(1) == nt && g->size(2) == nh && g->size(3) == nd &&
                      (nd == 1 || g->stride(3) == 1) && g->scalar_type() == q.scalar_type(),
                  "flashBackwardInto: a gradient of ", g->sizes(), " ", g->scalar_type(), " for q ", q.sizes());
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "flashBackward", [&] {
    using flash::rowsOf;
    using flash::rowsOfBthd;
    auto heads = [&](const at::Tensor& x) { return flash::headRows(x.data_ptr<scalar_t>(), nt, nh, nd); };
    flash::backwardKernel<scalar_t>(rowsOf<scalar_t>(q), rowsOf<scalar_t>(k), rowsOf<scalar_t>(v), heads(out),
                                    lse.data_ptr<scalar_t>(), heads(dOut), rowsOfBthd<scalar_t>(dq),
                                    rowsOfBthd<scalar_t>(dk), rowsOfBthd<scalar_t>(dv), nb, nh, nt, nd);
  });
}

}  // namespace detail
}  // namespace cohort::models
