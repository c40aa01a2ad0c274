#pragma once

// glibc malloc's policy for a process's freed memory (compute.allocator):
// what training ranks and `cohort serve` set before their tensors, and
// what summary.json reports. With tcmalloc or jemalloc preloaded these ask
// glibc for nothing that applies (env::servingMalloc says which serves).

namespace cohort {

// compute.allocator: keep. glibc keeps freed memory instead of returning it
// to the kernel (no heap trimming, no mmap for large blocks), so that the
// tensors of every step reuse the pages of the step before instead of
// faulting fresh zeroed ones in. Idempotent; returns false if glibc refused.
bool keepFreedMemory();

// compute.allocator: map. Blocks of 1 MB and more are mapped from the
// kernel and given back when freed (a fixed threshold also stops glibc's
// dynamic one, which would move blocks freed once onto the heap for good,
// where their holes stay resident). Returns false if glibc refused.
bool mapLargeBlocks();

// The policy last applied: "keep", "map" or "system" (neither).
const char* mallocPolicy();

}  // namespace cohort
