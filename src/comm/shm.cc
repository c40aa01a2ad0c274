#include "cohort/comm/shm.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "cohort/comm/wait.h"
#include "cohort/core/error.h"
#include "comm/detail/segment.h"

namespace cohort::comm {

using detail::futexWait;
using detail::futexWakeAll;
using detail::processAlive;

namespace {

constexpr uint32_t kMagic = 0x53484d32;  // "SHM2"

// The claimed sum's unit of work: 256 KB of each region. Small enough that
// ranks share a bucket's sum evenly, large enough that claiming costs
// nothing next to summing.
constexpr size_t kClaimFloats = size_t{1} << 16;

struct alignas(64) Counter {
  std::atomic<uint64_t> value{0};
};

}  // namespace

struct ShmAllreduce::Header {
  uint32_t magic;
  uint32_t world;
  uint64_t floatsPerRank;
  // Futex words, bumped on every arrival; [2]: the claimed sum's
  // publications and completions.
  alignas(64) std::atomic<uint32_t> generation[3];
  Counter arrived[2][kMaxRanks];                    // last sequence number each rank reached
  Counter nonfinite[kMaxRanks];  // 1: a NaN or Inf in the rank's share of the last sum
  std::atomic<int32_t> pid[kMaxRanks];              // each rank's process, to notice one that died
  // The claimed sum (publish, sumPublished). Each counter only grows:
  // published: the rank's step and how much of its region that step wrote,
  // as call * (floatsPerRank + 1) + floats, counting the calls before;
  // claimed: chunks over all calls so far; summed: the last call whose claims the rank summed;
  // lastNonfinite: the last call whose sum held a NaN or Inf.
  Counter published[kMaxRanks];
  Counter summed[kMaxRanks];
  Counter claimed;
  Counter lastNonfinite;
};

ShmAllreduce::ShmAllreduce(const std::string& name, int rank, int worldSize, size_t floatsPerRank,
                           bool create)
    : name_(name), rank_(rank), world_(worldSize), floatsPerRank_(floatsPerRank), creator_(create) {
  COHORT_ASSERT(worldSize >= 1 && worldSize <= kMaxRanks && rank >= 0 && rank < worldSize, "rank ",
                rank, " of ", worldSize);
  const size_t headerBytes = (sizeof(Header) + 4095) / 4096 * 4096;
  const size_t regionBytes = (floatsPerRank * sizeof(float) + 4095) / 4096 * 4096;
  bytes_ = headerBytes + regionBytes * static_cast<size_t>(worldSize);
  base_ = detail::mapSegment(name, bytes_, create);
  header_ = static_cast<Header*>(base_);
  if (create) {
    new (header_) Header{};  // the file is zero; this makes the atomics' lifetime explicit
    header_->world = static_cast<uint32_t>(worldSize);
    header_->floatsPerRank = floatsPerRank;
    std::atomic_thread_fence(std::memory_order_release);
    header_->magic = kMagic;
  }
  if (!create && (header_->magic != kMagic || header_->world != static_cast<uint32_t>(worldSize) ||
                  header_->floatsPerRank != floatsPerRank)) {
    detail::unmapSegment(base_, bytes_);
    base_ = nullptr;
    throw IoError(fmt::format("shared memory {}: made for another group ({} ranks, {} floats)", name,
                              header_->world, header_->floatsPerRank));
  }
  header_->pid[rank].store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  data_ = reinterpret_cast<float*>(static_cast<char*>(base_) + headerBytes);
  regionStride_ = regionBytes / sizeof(float);
}

ShmAllreduce::~ShmAllreduce() {
  if (creator_) unlink();
  if (base_ != nullptr) detail::unmapSegment(base_, bytes_);
}

void ShmAllreduce::unlink() {
  if (!unlinked_) ::shm_unlink(name_.c_str());
  unlinked_ = true;
}

float* ShmAllreduce::region() const { return regionOf(rank_); }

float* ShmAllreduce::regionOf(int index) const {
  COHORT_ASSERT(index >= 0 && index < world_, "region ", index, " of ", world_);
  return data_ + regionStride_ * static_cast<size_t>(index);
}

void ShmAllreduce::barrier(std::chrono::milliseconds timeout) {
  // One phase is enough: every call numbers its barriers, and a rank that
  // leaves this one early can only arrive at the next call's first.
  if (world_ > 1) enter(std::chrono::steady_clock::now() + timeout);
}

void ShmAllreduce::arrive(int phase, uint64_t seq) {
  header_->arrived[phase][rank_].value.store(seq, std::memory_order_release);
  header_->generation[phase].fetch_add(1, std::memory_order_acq_rel);
  futexWakeAll(&header_->generation[phase]);
}

void ShmAllreduce::waitAll(int phase, uint64_t seq, std::chrono::steady_clock::time_point deadline) {
  waitFor(phase, [&](int r) {
    return header_->arrived[phase][r].value.load(std::memory_order_acquire) >= seq;
  }, fmt::format("exchange {}", seq), deadline);
}

void ShmAllreduce::waitFor(int phase, const std::function<bool(int)>& there, const std::string& what,
                           std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const uint32_t generation = header_->generation[phase].load(std::memory_order_acquire);
    bool all = true;
    for (int r = 0; r < world_ && all; ++r) all = there(r);
    if (all) return;
    if (collectivesAbandoned()) {
      throw CommError(fmt::format("rank {}: shared-memory {} abandoned: the round re-forms",
                                  nameOf(rank_), what));
    }
    // A rank whose process is gone will never arrive: fail now, not at the
    // deadline (the same machine, so its pid says). Its arrival is read
    // again after it is seen gone: a rank may arrive, finish and exit
    // between the first read and the check of its process (its last
    // exchange), and it did arrive.
    for (int r = 0; r < world_; ++r) {
      const pid_t pid = header_->pid[r].load(std::memory_order_acquire);
      if (!there(r) && pid > 0 && !processAlive(pid) && !there(r)) {
        throw CommError(fmt::format("rank {}: shared-memory {}: rank {} (pid {}) has exited",
                                    nameOf(rank_), what, nameOf(r), pid));
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < world_; ++r) {
        if (!there(r)) missing.push_back(nameOf(r));
      }
      throw TimeoutError(fmt::format("rank {}: shared-memory {} timed out waiting for rank(s) {}",
                                     nameOf(rank_), what, fmt::join(missing, ", ")));
    }
    // Sleep until a rank arrives (the generation changes), at most 10 ms so
    // the deadline is checked.
    const timespec ts{0, 10'000'000};
    futexWait(&header_->generation[phase], generation, &ts);
  }
}

void ShmAllreduce::nameRanks(std::vector<int> names) {
  COHORT_ASSERT(names.size() == static_cast<size_t>(world_), names.size(), " names for ", world_,
                " ranks");
  names_ = std::move(names);
}

int ShmAllreduce::nameOf(int index) const {
  return names_.empty() ? index : names_[static_cast<size_t>(index)];
}

bool ShmAllreduce::allreduce(size_t offset, size_t n, std::chrono::milliseconds timeout) {
  COHORT_ASSERT(offset + n <= floatsPerRank_, "range ", offset, "+", n, " past ", floatsPerRank_);
  if (world_ == 1 || n == 0) return allFinite(region() + offset, n);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const uint64_t seq = enter(deadline);
  // This rank's share, in whole cache lines.
  const size_t per = ((n + world_ - 1) / world_ + 15) / 16 * 16;
  const size_t begin = std::min(n, per * static_cast<size_t>(rank_));
  const size_t end = std::min(n, begin + per);
  const bool finite = sumIntoEveryRegion(offset + begin, offset + end);
  return agreeFinite(finite, seq, deadline);
}

bool ShmAllreduce::sumIntoEveryRegion(size_t begin, size_t end) {
  bool finite = true;
  float* regions[kMaxRanks];
  for (int r = 0; r < world_; ++r) regions[r] = data_ + regionStride_ * static_cast<size_t>(r);
  constexpr size_t kBlock = 2048;  // sum a block in a local buffer, then write it to every region
  float sum[kBlock];
  for (size_t at = begin; at < end; at += kBlock) {
    const size_t len = std::min(kBlock, end - at);
    std::memcpy(sum, regions[0] + at, len * sizeof(float));
    for (int r = 1; r < world_; ++r) {
      const float* src = regions[r] + at;
      for (size_t i = 0; i < len; ++i) sum[i] += src[i];
    }
    // While the block is in the cache: the finiteness check costs almost
    // nothing here, where a separate pass would read every gradient again.
    finite = allFinite(sum, len) && finite;
    for (int r = 0; r < world_; ++r) std::memcpy(regions[r] + at, sum, len * sizeof(float));
  }
  return finite;
}

void ShmAllreduce::publish(size_t end) {
  COHORT_ASSERT(end <= floatsPerRank_, "published ", end, " floats of ", floatsPerRank_);
  const uint64_t position = sums_ * (floatsPerRank_ + 1) + end;
  Counter& mine = header_->published[rank_];
  if (position <= mine.value.load(std::memory_order_relaxed)) return;
  mine.value.store(position, std::memory_order_release);
  header_->generation[2].fetch_add(1, std::memory_order_acq_rel);
  futexWakeAll(&header_->generation[2]);
}

bool ShmAllreduce::sumPublished(size_t n, std::chrono::milliseconds timeout) {
  COHORT_ASSERT(n <= floatsPerRank_, "sum of ", n, " floats of ", floatsPerRank_);
  if (world_ == 1) {
    ++sums_;
    return allFinite(region(), n);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  publish(n);
  const uint64_t call = ++sums_;
  const uint64_t base = (call - 1) * (floatsPerRank_ + 1);  // this call's publications start here
  const uint64_t chunks = (n + kClaimFloats - 1) / kClaimFloats;
  const uint64_t first = chunkBase_;
  const uint64_t last = first + chunks;
  chunkBase_ = last;
  bool finite = true;
  Counter& claimed = header_->claimed;
  for (;;) {
    // Compare-and-swap, not an add: a claim past this call's last chunk
    // would take the next call's first.
    uint64_t next = claimed.value.load(std::memory_order_acquire);
    if (next >= last) break;
    COHORT_ASSERT(next >= first, "claimed chunk ", next, " before this sum's first, ", first);
    if (!claimed.value.compare_exchange_weak(next, next + 1, std::memory_order_acq_rel)) continue;
    const size_t begin = static_cast<size_t>(next - first) * kClaimFloats;
    const size_t end = std::min(n, begin + kClaimFloats);
    // Every rank must have written the chunk: the one still in backward
    // publishes it as its bucket fills.
    auto published = [&](int r) {
      return header_->published[r].value.load(std::memory_order_acquire) >= base + end;
    };
    bool all = true;
    for (int r = 0; r < world_ && all; ++r) all = published(r);
    if (!all) waitFor(2, published, fmt::format("sum {}: floats {}-{}", call, begin, end), deadline);
    finite = sumIntoEveryRegion(begin, end) && finite;
    if (!finite) {
      // Only grows (a compare-and-swap loop: an atomic maximum).
      uint64_t marked = header_->lastNonfinite.value.load(std::memory_order_relaxed);
      while (marked < call && !header_->lastNonfinite.value.compare_exchange_weak(marked, call)) {
      }
    }
  }
  // This rank's claims are summed into every region. Once every rank says
  // so, every chunk is (the claims ran out before any rank got here).
  header_->summed[rank_].value.store(call, std::memory_order_release);
  header_->generation[2].fetch_add(1, std::memory_order_acq_rel);
  futexWakeAll(&header_->generation[2]);
  waitFor(2, [&](int r) { return header_->summed[r].value.load(std::memory_order_acquire) >= call; },
          fmt::format("sum {}", call), deadline);
  return header_->lastNonfinite.value.load(std::memory_order_acquire) < call;
}

uint64_t ShmAllreduce::enter(std::chrono::steady_clock::time_point deadline) {
  const uint64_t seq = ++seq_;
  arrive(0, seq);
  waitAll(0, seq, deadline);
  return seq;
}

bool ShmAllreduce::agreeFinite(bool finite, uint64_t seq,
                               std::chrono::steady_clock::time_point deadline) {
  // Published before arriving: no rank writes its flag of the next call
  // before every rank has left this one (the next call's first barrier).
  header_->nonfinite[rank_].value.store(finite ? 0 : 1, std::memory_order_relaxed);
  arrive(1, seq);
  waitAll(1, seq, deadline);
  for (int r = 0; r < world_; ++r) {
    if (header_->nonfinite[r].value.load(std::memory_order_relaxed) != 0) return false;
  }
  return true;
}

size_t ShmAllreduce::chunkOf(size_t offset, size_t n) const {
  COHORT_ASSERT(offset + n <= floatsPerRank_, "range ", offset, "+", n, " past ", floatsPerRank_);
  COHORT_ASSERT(n % static_cast<size_t>(world_) == 0, n, " floats do not split over ", world_, " ranks");
  return n / static_cast<size_t>(world_);
}

bool ShmAllreduce::reduceScatter(size_t offset, size_t n, std::chrono::milliseconds timeout) {
  const size_t chunk = chunkOf(offset, n);
  float* mine = region() + offset + chunk * static_cast<size_t>(rank_);
  if (world_ == 1 || n == 0) return allFinite(mine, chunk);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const uint64_t seq = enter(deadline);
  // Rank r's chunk is read by no other rank: the sum goes straight into it.
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const float* __restrict__ src =
        data_ + regionStride_ * static_cast<size_t>(r) + offset + chunk * static_cast<size_t>(rank_);
    float* __restrict__ dst = mine;
    for (size_t i = 0; i < chunk; ++i) dst[i] += src[i];
  }
  // The second barrier also keeps every rank from writing its region again
  // (the next step's gradients) while another still reads its chunk there.
  return agreeFinite(allFinite(mine, chunk), seq, deadline);
}

void ShmAllreduce::allgather(size_t offset, size_t n, std::chrono::milliseconds timeout) {
  const size_t chunk = chunkOf(offset, n);
  if (world_ == 1 || n == 0) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const uint64_t seq = enter(deadline);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const size_t at = offset + chunk * static_cast<size_t>(r);
    std::memcpy(region() + at, data_ + regionStride_ * static_cast<size_t>(r) + at, chunk * sizeof(float));
  }
  // Every rank's own chunk must stay as it is until all have copied it.
  arrive(1, seq);
  waitAll(1, seq, deadline);
}

bool allFinite(const float* data, size_t n) {
  // An exponent of all ones is Inf or NaN. Integer operations, so the loop
  // vectorizes (a float reduction would not, without fast-math).
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

void ShmAllreduce::broadcast(size_t offset, size_t n, int root, std::chrono::milliseconds timeout) {
  COHORT_ASSERT(offset + n <= floatsPerRank_, "range ", offset, "+", n, " past ", floatsPerRank_);
  COHORT_ASSERT(root >= 0 && root < world_, "root ", root, " of ", world_);
  if (world_ == 1 || n == 0) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const uint64_t seq = enter(deadline);
  if (rank_ != root) {
    const float* from = data_ + regionStride_ * static_cast<size_t>(root) + offset;
    std::memcpy(region() + offset, from, n * sizeof(float));
  }
  arrive(1, seq);
  // Only root's region is read: the others may go on writing their own. (A
  // later call's first barrier orders everything else.)
  if (rank_ == root) waitAll(1, seq, deadline);
}

}  // namespace cohort::comm
