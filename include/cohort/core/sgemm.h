#pragma once

// oneDNN's float32 matrix product (dnnl_sgemm, from the libdnnl.so.2
// LibTorch itself links): linear layers run it (cohort/models/linear.h) and
// the GEMM ceiling measures it (cohort/health/ceiling.h). oneDNN picks its
// kernels from the CPU it runs on (ONEDNN_MAX_CPU_ISA holds them) and runs
// on the calling thread's OpenMP threads, which are LibTorch's intra-op
// threads.
//
// This header includes neither LibTorch nor oneDNN.

#include <cstdint>

namespace cohort {

// C [m, n] = alpha op(A) op(B) + beta C for row-major matrices: op(A) is
// A [m, k], or A^T when transA (A stored [k, m]); op(B) is B [k, n], or B^T
// when transB (B stored [n, k]); lda, ldb and ldc are the stored rows'
// strides. Throws Error naming the shapes and oneDNN's status on failure.
void oneDnnSgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace cohort
