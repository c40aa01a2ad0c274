#pragma once

// The loops of the fused training ops (models/fused_kernels.h), written once
// over ATen's Vectorized and compiled once per instruction set: each of
// models/fused_kernels_{base,avx2,avx512}.cc includes this file with
// COHORT_KERNEL_ISA naming its table (base, avx2, avx512) and, for the
// vector builds, ATen's CPU_CAPABILITY and the matching -m flags
// (cmake/cpu_kernels.cmake). Everything here has internal linkage: a build
// exports nothing but its table, so no AVX-512 copy of a function can stand
// in for another build's at link time. ATen's vector types call SLEEF for
// exp, erf and tanh (libsleef-dev, the library LibTorch itself links).

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "models/fused_kernels.h"

#ifndef COHORT_KERNEL_ISA
#error "models/detail/fused_kernels_impl.h: COHORT_KERNEL_ISA names the build (base, avx2, avx512)"
#endif

namespace cohort::models::detail::kernels {
namespace {

template <typename T>
using Vec = at::vec::Vectorized<T>;

// Elements a chunk of parallel_for takes at least (ATen's GRAIN_SIZE).
constexpr int64_t kGrain = 32768;
// Rows per block of a reduction over rows (see fused_kernels.h).
constexpr int64_t kBlockRows = 64;
// A float accumulator adds at most this many values before its sum moves
// into a double: sums over a channel of 32 images of 32x32 px stay exact
// to ~1e-7 instead of ~1e-5.
constexpr int64_t kFlush = 1024;

int64_t rowGrain(int64_t n) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, n)); }

template <typename T>
double hsum(const Vec<T>& v) {
  T lanes[Vec<T>::size()];
  v.store(lanes);
  double s = 0;
  for (int64_t i = 0; i < Vec<T>::size(); ++i) s += lanes[i];
  return s;
}

// Calls f(j, count) over [0, n) one vector at a time, count < size() only
// for the last (the tail, whose loads fill the missing lanes with zeros).
template <typename T, typename F>
inline void eachVector(int64_t n, F f) {
  constexpr int64_t V = Vec<T>::size();
  int64_t j = 0;
  for (; j + V <= n; j += V) f(j, V);
  if (j < n) f(j, n - j);
}

template <typename T>
inline Vec<T> load(const T* p, int64_t count) {
  return count == Vec<T>::size() ? Vec<T>::loadu(p) : Vec<T>::loadu(p, count);
}

// v with the lanes from `count` on zeroed (a tail's), v itself for a whole vector.
template <typename T>
inline Vec<T> firstLanes(const Vec<T>& v, int64_t count) {
  return count == Vec<T>::size() ? v : Vec<T>::set(Vec<T>(0), v, count);
}

// Column sums over blocks of partial sums: out[j] = sum over b of part[b][j],
// in block order.
template <typename T>
void sumBlocks(const std::vector<double>& part, int64_t blocks, int64_t n, T* out) {
  if (out == nullptr) return;
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t b = 0; b < blocks; ++b) s += part[static_cast<size_t>(b * n + j)];
    out[j] = static_cast<T>(s);
  }
}

// --- GELU and its slope ------------------------------------------------------

// Exact GELU's normal CDF at u, Phi(u) = (1 + erf(u / sqrt 2)) / 2, and its
// density phi(u) = exp(-u^2 / 2) / sqrt(2 pi). Float32 takes erf as oneDNN's
// gelu_erf does, which is what ATen's float32 CPU gelu runs (the polynomial of
// Abramowitz and Stegun 7.1.26 times exp(-x^2), |error| <= 1.5e-7): the
// density's exp serves both. Float64 keeps SLEEF's erf (1 ulp).
template <typename T>
inline void normalCdfPdf(const Vec<T>& u, Vec<T>& cdf, Vec<T>& pdf) {
  const Vec<T> half(0.5), one(1);
  const Vec<T> u2 = u * u;
  Vec<T> e;
  if constexpr (std::is_same_v<T, float>) {
    // Past |u| = 12.6 the tail and the density are zero rather than
    // subnormal, and exp never makes a subnormal on its way (its argument
    // held at -80): subnormals cost microcode assists in every operation
    // that makes or reads them (the products after this one among them),
    // where the values differ from zero by under 1e-34.
    e = at::vec::maximum(u2 * Vec<T>(-0.5), Vec<T>(-80)).exp() & (u2 < Vec<T>(160));
  } else {
    e = (u2 * Vec<T>(-0.5)).exp();
  }
  pdf = Vec<T>(M_2_SQRTPI * M_SQRT1_2 * 0.5) * e;
  if constexpr (std::is_same_v<T, float>) {
    const Vec<T> t = one / (one + Vec<T>(0.3275911 * M_SQRT1_2) * u.abs());
    Vec<T> poly = Vec<T>(1.061405429);
    poly = poly * t + Vec<T>(-1.453152027);
    poly = poly * t + Vec<T>(1.421413741);
    poly = poly * t + Vec<T>(-0.284496736);
    poly = poly * t + Vec<T>(0.254829592);
    // erfc(|u| / sqrt 2) / 2: the CDF's distance from 0 or 1.
    const Vec<T> tail = half * poly * t * e;
    cdf = Vec<T>::blendv(one - tail, tail, u < Vec<T>(0));
  } else {
    cdf = half * (one + (u * Vec<T>(M_SQRT1_2)).erf());
  }
}

// y = gelu(u) and slope = gelu'(u); tanh: GELU's tanh approximation, as
// ATen's GeluKernel computes it.
template <typename T>
inline void geluAndSlope(const Vec<T>& u, bool tanh, Vec<T>& y, Vec<T>& slope) {
  const Vec<T> half(0.5), one(1);
  if (tanh) {
    const Vec<T> beta(M_SQRT2 * M_2_SQRTPI * 0.5), kappa(0.044715), three(3);
    const Vec<T> u2 = u * u;
    // tanh is +-1 in float past |x| = 9.1; held to +-10, its argument
    // makes no subnormal inside SLEEF's tanh (see normalCdfPdf).
    Vec<T> inner = beta * (u + kappa * u2 * u);
    if constexpr (std::is_same_v<T, float>) inner = at::vec::clamp(inner, Vec<T>(-10), Vec<T>(10));
    const Vec<T> t = inner.tanh();
    const Vec<T> left = half * u;
    y = left * (one + t);
    slope = half * (one + t) + left * (one - t * t) * beta * (one + three * kappa * u2);
    return;
  }
  Vec<T> cdf, pdf;
  normalCdfPdf(u, cdf, pdf);
  y = u * cdf;
  slope = cdf + u * pdf;
}

template <typename T>
void biasGeluForward(const T* h, const T* b, T* y, T* slope, int64_t rows, int64_t n, bool tanh) {
  at::parallel_for(0, rows, rowGrain(n), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* hr = h + r * n;
      T* yr = y + r * n;
      T* sr = slope != nullptr ? slope + r * n : nullptr;
      eachVector<T>(n, [&](int64_t j, int64_t k) {
        const Vec<T> u = b != nullptr ? load(hr + j, k) + load(b + j, k) : load(hr + j, k);
        Vec<T> g, s;
        geluAndSlope(u, tanh, g, s);
        g.store(yr + j, static_cast<int>(k));
        if (sr != nullptr) s.store(sr + j, static_cast<int>(k));
      });
    }
  });
}

// Over blocks of kBlockRows rows, on the intra-op threads: row(r, acc)
// handles row r and adds what it sums into acc (n values, zeros at each
// block's start; acc is null when out is); the blocks' sums go into out
// (when not null) in block order, whatever the threads.
template <typename T, typename Row>
void overRowBlocks(int64_t rows, int64_t n, T* out, Row row) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  std::vector<double> part(out != nullptr ? static_cast<size_t>(blocks * n) : 0);
  double* partData = part.data();
  at::parallel_for(0, blocks, std::max<int64_t>(1, rowGrain(n) / kBlockRows), [=](int64_t b0, int64_t b1) {
    std::vector<T> acc(out != nullptr ? static_cast<size_t>(n) : 0);
    T* accData = out != nullptr ? acc.data() : nullptr;
    for (int64_t blk = b0; blk < b1; ++blk) {
      std::fill(acc.begin(), acc.end(), T(0));
      const int64_t rEnd = std::min(rows, (blk + 1) * kBlockRows);
      for (int64_t r = blk * kBlockRows; r < rEnd; ++r) row(r, accData);
      if (out != nullptr) {
        for (int64_t j = 0; j < n; ++j) partData[blk * n + j] = acc[static_cast<size_t>(j)];
      }
    }
  });
  if (out != nullptr) sumBlocks(part, blocks, n, out);
}

template <typename T>
void biasGeluBackward(const T* gy, const T* slope, T* gh, T* gb, int64_t rows, int64_t n) {
  overRowBlocks<T>(rows, n, gb, [=](int64_t r, T* acc) {
    const T* gyr = gy + r * n;
    const T* sr = slope + r * n;
    T* ghr = gh + r * n;
    eachVector<T>(n, [&](int64_t j, int64_t k) {
      const Vec<T> g = load(gyr + j, k) * load(sr + j, k);
      g.store(ghr + j, static_cast<int>(k));
      if (acc != nullptr) (load(acc + j, k) + g).store(acc + j, static_cast<int>(k));
    });
  });
}

// --- A linear layer's bias ---------------------------------------------------

template <typename T>
void columnSums(const T* g, T* out, int64_t rows, int64_t n) {
  overRowBlocks<T>(rows, n, out, [=](int64_t r, T* acc) {
    const T* gr = g + r * n;
    eachVector<T>(n, [&](int64_t j, int64_t k) {
      (load(acc + j, k) + load(gr + j, k)).store(acc + j, static_cast<int>(k));
    });
  });
}

template <typename T>
void addToRows(T* y, const T* b, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, rowGrain(n), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* yr = y + r * n;
      eachVector<T>(n, [&](int64_t j, int64_t k) {
        (load(yr + j, k) + load(b + j, k)).store(yr + j, static_cast<int>(k));
      });
    }
  });
}

template <typename T>
void addLayerNormForward(const T* x, const T* d, const T* w, const T* b, T* s, T* y, T* mean, T* rstd,
                         int64_t rows, int64_t n, double eps) {
  at::parallel_for(0, rows, rowGrain(n), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * n;
      const T* dr = d + r * n;
      T* sr = s + r * n;
      T* yr = y + r * n;
      // The row is in L1 after the first pass: two more over it are cheap,
      // and the variance from (s - mean)^2 does not cancel as E[s^2] - mean^2 would.
      Vec<T> acc(0);
      eachVector<T>(n, [&](int64_t j, int64_t k) {
        const Vec<T> v = load(xr + j, k) + load(dr + j, k);
        v.store(sr + j, static_cast<int>(k));
        acc += v;
      });
      const T m = static_cast<T>(hsum(acc) / static_cast<double>(n));
      const Vec<T> mv(m);
      Vec<T> sq(0);
      eachVector<T>(n, [&](int64_t j, int64_t k) {
        const Vec<T> c = firstLanes(load(sr + j, k) - mv, k);
        sq += c * c;
      });
      const double var = hsum(sq) / static_cast<double>(n);
      const T rs = static_cast<T>(1.0 / std::sqrt(var + eps));
      const Vec<T> rv(rs);
      eachVector<T>(n, [&](int64_t j, int64_t k) {
        Vec<T> o = (load(sr + j, k) - mv) * rv * load(w + j, k);
        if (b != nullptr) o = o + load(b + j, k);
        o.store(yr + j, static_cast<int>(k));
      });
      mean[r] = m;
      rstd[r] = rs;
    }
  });
}

template <typename T>
void addLayerNormBackward(const T* gs, const T* gy, const T* s, const T* mean, const T* rstd, const T* w, T* gx,
                          T* gw, T* gb, int64_t rows, int64_t n) {
  const bool params = gw != nullptr || gb != nullptr;
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  std::vector<double> partW(params ? static_cast<size_t>(blocks * n) : 0);
  std::vector<double> partB(params ? static_cast<size_t>(blocks * n) : 0);
  double* pw = partW.data();
  double* pb = partB.data();
  at::parallel_for(0, blocks, std::max<int64_t>(1, rowGrain(n) / kBlockRows), [=](int64_t b0, int64_t b1) {
    std::vector<T> accW(params ? static_cast<size_t>(n) : 0), accB(params ? static_cast<size_t>(n) : 0);
    for (int64_t blk = b0; blk < b1; ++blk) {
      std::fill(accW.begin(), accW.end(), T(0));
      std::fill(accB.begin(), accB.end(), T(0));
      const int64_t rEnd = std::min(rows, (blk + 1) * kBlockRows);
      for (int64_t r = blk * kBlockRows; r < rEnd; ++r) {
        const T* gsr = gs + r * n;
        const T* gyr = gy + r * n;
        const T* sr = s + r * n;
        T* gxr = gx + r * n;
        const Vec<T> mv(mean[r]), rv(rstd[r]);
        // gx = gs + rstd * (g - mean(g) - xhat * mean(g * xhat)), g = gy * w;
        // the tail's lanes load gy = 0 and add nothing to the sums.
        Vec<T> sg(0), sgx(0);
        eachVector<T>(n, [&](int64_t j, int64_t k) {
          const Vec<T> g = load(gyr + j, k) * load(w + j, k);
          const Vec<T> xhat = (load(sr + j, k) - mv) * rv;
          sg += g;
          sgx += g * xhat;
        });
        const Vec<T> a(static_cast<T>(hsum(sg) / static_cast<double>(n)));
        const Vec<T> c(static_cast<T>(hsum(sgx) / static_cast<double>(n)));
        eachVector<T>(n, [&](int64_t j, int64_t k) {
          const Vec<T> gyv = load(gyr + j, k);
          const Vec<T> xhat = (load(sr + j, k) - mv) * rv;
          const Vec<T> g = gyv * load(w + j, k);
          (load(gsr + j, k) + rv * (g - a - xhat * c)).store(gxr + j, static_cast<int>(k));
          if (params) {
            (load(accW.data() + j, k) + gyv * xhat).store(accW.data() + j, static_cast<int>(k));
            (load(accB.data() + j, k) + gyv).store(accB.data() + j, static_cast<int>(k));
          }
        });
      }
      if (params) {
        for (int64_t j = 0; j < n; ++j) {
          pw[blk * n + j] = accW[static_cast<size_t>(j)];
          pb[blk * n + j] = accB[static_cast<size_t>(j)];
        }
      }
    }
  });
  sumBlocks(partW, blocks, n, gw);
  sumBlocks(partB, blocks, n, gb);
}

// --- BatchNorm + ReLU --------------------------------------------------------
//
// Channels-first: channel c of image i is the hw values at (i * c + c) * hw;
// the statistics and the backward's sums go over channels in parallel, each
// channel's values in turn. Channels-last: rows of c values, one per pixel;
// sums go over fixed blocks of rows in parallel, one float vector per channel
// group, then over the blocks in order in double.

// Channels-first: the sum over channel ch of x, or with `mean` of (x - *mean)^2.
template <typename T>
double channelSum(const T* x, BnShape sh, int64_t ch, const T* mean) {
  double total = 0;
  for (int64_t i = 0; i < sh.n; ++i) {
    const T* p = x + (i * sh.c + ch) * sh.hw;
    for (int64_t f0 = 0; f0 < sh.hw; f0 += kFlush) {
      Vec<T> acc(0);
      const int64_t len = std::min(kFlush, sh.hw - f0);
      if (mean == nullptr) {
        eachVector<T>(len, [&](int64_t j, int64_t k) { acc += load(p + f0 + j, k); });
      } else {
        const Vec<T> mv(*mean);
        eachVector<T>(len, [&](int64_t j, int64_t k) {
          const Vec<T> c = firstLanes(load(p + f0 + j, k) - mv, k);
          acc += c * c;
        });
      }
      total += hsum(acc);
    }
  }
  return total;
}

// Channels-last: f(row, acc) adds a row into nOut float sums per channel
// (acc[o * c + channel]); out[o][channel] gets their totals over every row.
template <typename T, typename F>
void rowBlockSums(BnShape sh, int nOut, double* const* out, F f) {
  const int64_t rows = sh.n * sh.hw, c = sh.c;
  const int64_t blocks = (rows + kFlush - 1) / kFlush;
  std::vector<double> part(static_cast<size_t>(blocks * c * nOut));
  double* pd = part.data();
  at::parallel_for(0, blocks, std::max<int64_t>(1, rowGrain(c) / kFlush), [=, &f](int64_t b0, int64_t b1) {
    std::vector<T> acc(static_cast<size_t>(c * nOut));
    for (int64_t blk = b0; blk < b1; ++blk) {
      double* total = pd + blk * c * nOut;
      std::fill(total, total + c * nOut, 0.0);
      const int64_t rEnd = std::min(rows, (blk + 1) * kFlush);
      // A channel's float sum takes one value per row: it moves into the
      // block's double sum every kBlockRows rows (over 1024 rows, a float
      // sum of 5000 values was 1e-4 off where ATen's, in double, was 1e-5).
      for (int64_t r0 = blk * kFlush; r0 < rEnd; r0 += kBlockRows) {
        std::fill(acc.begin(), acc.end(), T(0));
        for (int64_t r = r0; r < std::min(rEnd, r0 + kBlockRows); ++r) f(r, acc.data());
        for (int64_t j = 0; j < c * nOut; ++j) total[j] += acc[static_cast<size_t>(j)];
      }
    }
  });
  for (int o = 0; o < nOut; ++o) {
    for (int64_t j = 0; j < c; ++j) {
      double s = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) s += pd[(blk * nOut + o) * c + j];
      out[o][j] = s;
    }
  }
}

template <typename T>
inline Vec<T> affine(Vec<T> x, Vec<T> scale, Vec<T> shift) {
  return x * scale + shift;
}

template <typename T>
void batchNormStats(const T* x, BnShape sh, T* mean, T* var) {
  const double count = static_cast<double>(sh.n * sh.hw);
  if (!sh.channelsLast) {
    at::parallel_for(0, sh.c, 1, [=](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        mean[ch] = static_cast<T>(channelSum<T>(x, sh, ch, nullptr) / count);
        var[ch] = static_cast<T>(channelSum<T>(x, sh, ch, mean + ch) / count);
      }
    });
    return;
  }
  const int64_t c = sh.c;
  std::vector<double> sum(static_cast<size_t>(c));
  double* outs[1] = {sum.data()};
  rowBlockSums<T>(sh, 1, outs, [=](int64_t r, T* acc) {
    eachVector<T>(c, [&](int64_t j, int64_t k) {
      (load(acc + j, k) + load(x + r * c + j, k)).store(acc + j, static_cast<int>(k));
    });
  });
  for (int64_t j = 0; j < c; ++j) mean[j] = static_cast<T>(sum[static_cast<size_t>(j)] / count);
  rowBlockSums<T>(sh, 1, outs, [=](int64_t r, T* acc) {
    eachVector<T>(c, [&](int64_t j, int64_t k) {
      const Vec<T> d = load(x + r * c + j, k) - load(mean + j, k);
      (load(acc + j, k) + d * d).store(acc + j, static_cast<int>(k));
    });
  });
  for (int64_t j = 0; j < c; ++j) var[j] = static_cast<T>(sum[static_cast<size_t>(j)] / count);
}

template <typename T>
void batchNormReluForward(const T* x, const T* scale, const T* shift, T* y, BnShape sh) {
  const Vec<T> zero(0);
  if (!sh.channelsLast) {
    at::parallel_for(0, sh.n * sh.c, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, sh.hw)),
                     [=](int64_t p0, int64_t p1) {
                       for (int64_t p = p0; p < p1; ++p) {
                         const Vec<T> sc(scale[p % sh.c]), sf(shift[p % sh.c]);
                         const T* xp = x + p * sh.hw;
                         T* yp = y + p * sh.hw;
                         eachVector<T>(sh.hw, [&](int64_t j, int64_t k) {
                           at::vec::maximum(affine(load(xp + j, k), sc, sf), zero).store(yp + j, static_cast<int>(k));
                         });
                       }
                     });
    return;
  }
  const int64_t c = sh.c;
  at::parallel_for(0, sh.n * sh.hw, rowGrain(c), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      eachVector<T>(c, [&](int64_t j, int64_t k) {
        at::vec::maximum(affine(load(x + r * c + j, k), load(scale + j, k), load(shift + j, k)), zero)
            .store(y + r * c + j, static_cast<int>(k));
      });
    }
  });
}

template <typename T>
void batchNormReluBackward(const T* gy, const T* x, const T* mean, const T* invstd, const T* scale, const T* shift,
                           T* gx, T* gw, T* gb, BnShape sh) {
  // With g = gy where x * scale + shift > 0, else 0, and per channel
  // sg = sum g, sgx = sum g (x - mean) over the count values:
  //   gx = scale * (g - sg / count - (x - mean) * invstd^2 * sgx / count)
  //   gw = sgx * invstd, gb = sg.
  const double count = static_cast<double>(sh.n * sh.hw);
  // The mask as 1 and 0 (gt()), multiplied in: a comparison's all-ones
  // lanes and blendv() go lane by lane in ATen's portable Vectorized, 5x
  // slower. The gradient where the ReLU is off is gy * 0: 0, or NaN for an
  // infinite gy (where threshold_backward gives 0).
  const Vec<T> zero(0);
  auto masked = [zero](Vec<T> g, Vec<T> x, Vec<T> sc, Vec<T> sf) { return g * affine(x, sc, sf).gt(zero); };
  const int64_t c = sh.c;
  std::vector<double> sg(static_cast<size_t>(c)), sgx(static_cast<size_t>(c));
  double* sgp = sg.data();
  double* sgxp = sgx.data();
  if (!sh.channelsLast) {
    at::parallel_for(0, c, 1, [=](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        const Vec<T> sc(scale[ch]), sf(shift[ch]), mv(mean[ch]);
        double a = 0, b = 0;
        for (int64_t i = 0; i < sh.n; ++i) {
          const int64_t base = (i * c + ch) * sh.hw;
          for (int64_t f0 = 0; f0 < sh.hw; f0 += kFlush) {
            Vec<T> va(0), vb(0);
            eachVector<T>(std::min(kFlush, sh.hw - f0), [&](int64_t j, int64_t k) {
              const Vec<T> xv = load(x + base + f0 + j, k);
              const Vec<T> g = masked(load(gy + base + f0 + j, k), xv, sc, sf);
              va += g;
              vb += g * (xv - mv);
            });
            a += hsum(va);
            b += hsum(vb);
          }
        }
        sgp[ch] = a;
        sgxp[ch] = b;
      }
    });
  } else {
    double* outs[2] = {sgp, sgxp};
    rowBlockSums<T>(sh, 2, outs, [=](int64_t r, T* acc) {
      eachVector<T>(c, [&](int64_t j, int64_t k) {
        const Vec<T> xv = load(x + r * c + j, k);
        const Vec<T> g = masked(load(gy + r * c + j, k), xv, load(scale + j, k), load(shift + j, k));
        (load(acc + j, k) + g).store(acc + j, static_cast<int>(k));
        (load(acc + c + j, k) + g * (xv - load(mean + j, k))).store(acc + c + j, static_cast<int>(k));
      });
    });
  }
  // Per channel: gx = scale * g - k2 * (x - mean) - k0.
  std::vector<T> k0(static_cast<size_t>(c)), k2(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) {
    const double is = invstd[j];
    k0[static_cast<size_t>(j)] = static_cast<T>(scale[j] * sg[static_cast<size_t>(j)] / count);
    k2[static_cast<size_t>(j)] = static_cast<T>(scale[j] * is * is * sgx[static_cast<size_t>(j)] / count);
    if (gw != nullptr) gw[j] = static_cast<T>(sgx[static_cast<size_t>(j)] * is);
    if (gb != nullptr) gb[j] = static_cast<T>(sg[static_cast<size_t>(j)]);
  }
  const T* k0p = k0.data();
  const T* k2p = k2.data();
  if (gx == nullptr) return;
  if (!sh.channelsLast) {
    at::parallel_for(0, sh.n * c, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, sh.hw)),
                     [=](int64_t p0, int64_t p1) {
                       for (int64_t p = p0; p < p1; ++p) {
                         const int64_t ch = p % c;
                         const Vec<T> sc(scale[ch]), sf(shift[ch]), mv(mean[ch]), a(k0p[ch]), b(k2p[ch]);
                         const int64_t base = p * sh.hw;
                         eachVector<T>(sh.hw, [&](int64_t j, int64_t k) {
                           const Vec<T> xv = load(x + base + j, k);
                           const Vec<T> g = masked(load(gy + base + j, k), xv, sc, sf);
                           (sc * g - b * (xv - mv) - a).store(gx + base + j, static_cast<int>(k));
                         });
                       }
                     });
    return;
  }
  at::parallel_for(0, sh.n * sh.hw, rowGrain(c), [=](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      eachVector<T>(c, [&](int64_t j, int64_t k) {
        const Vec<T> xv = load(x + r * c + j, k);
        const Vec<T> sc = load(scale + j, k);
        const Vec<T> g = masked(load(gy + r * c + j, k), xv, sc, load(shift + j, k));
        (sc * g - load(k2p + j, k) * (xv - load(mean + j, k)) - load(k0p + j, k)).store(gx + r * c + j,
                                                                                      static_cast<int>(k));
      });
    }
  });
}

template <typename T>
FusedKernelTable<T> table() {
  return {&biasGeluForward<T>,      &biasGeluBackward<T>, &addLayerNormForward<T>,
          &addLayerNormBackward<T>,  &batchNormStats<T>,   &batchNormReluForward<T>,
          &batchNormReluBackward<T>, &columnSums<T>,       &addToRows<T>};
}

}  // namespace
}  // namespace cohort::models::detail::kernels

namespace cohort::models::detail::isa {

const FusedKernelTable<float>& COHORT_KERNEL_ISA(float) {
  static const FusedKernelTable<float> t = kernels::table<float>();
  return t;
}

const FusedKernelTable<double>& COHORT_KERNEL_ISA(double) {
  static const FusedKernelTable<double> t = kernels::table<double>();
  return t;
}

}  // namespace cohort::models::detail::isa
