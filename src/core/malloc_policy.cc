#include "cohort/core/malloc_policy.h"

#include <malloc.h>

#include <atomic>
#include <climits>

namespace cohort {

namespace {

std::atomic<bool> keepingFreedMemory{false};
std::atomic<bool> mappingLargeBlocks{false};

}  // namespace

bool mapLargeBlocks() {
  const bool ok = mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1;
  if (ok) mappingLargeBlocks = true;
  return ok;
}

bool keepFreedMemory() {
  // M_MMAP_MAX 0: large blocks come from the heap too, and are reused once
  // freed; M_TRIM_THRESHOLD at its maximum: the top of the heap is never
  // handed back. Setting either also stops glibc's dynamic thresholds.
  const bool ok = mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
  keepingFreedMemory = ok;
  return ok;
}

const char* mallocPolicy() { return keepingFreedMemory ? "keep" : mappingLargeBlocks ? "map" : "system"; }

}  // namespace cohort
