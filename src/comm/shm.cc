#include "cohort/comm/shm.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::comm {

namespace {

constexpr uint32_t kMagic = 0x53484d31;  // "SHM1"

struct alignas(64) Counter {
  std::atomic<uint64_t> value{0};
};

int futexWait(std::atomic<uint32_t>* word, uint32_t expected, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word is shared between processes.
  return static_cast<int>(
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, timeout, nullptr, 0));
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

struct ShmAllreduce::Header {
  uint32_t magic;
  uint32_t world;
  uint64_t floatsPerRank;
  alignas(64) std::atomic<uint32_t> generation[2];  // futex words, bumped on every arrival
  Counter arrived[2][kMaxRanks];                    // last sequence number each rank reached
};

ShmAllreduce::ShmAllreduce(const std::string& name, int rank, int worldSize, size_t floatsPerRank,
                           bool create)
    : name_(name), rank_(rank), world_(worldSize), floatsPerRank_(floatsPerRank) {
  COHORT_ASSERT(worldSize >= 1 && worldSize <= kMaxRanks && rank >= 0 && rank < worldSize, "rank ",
                rank, " of ", worldSize);
  const size_t headerBytes = (sizeof(Header) + 4095) / 4096 * 4096;
  const size_t regionBytes = (floatsPerRank * sizeof(float) + 4095) / 4096 * 4096;
  bytes_ = headerBytes + regionBytes * static_cast<size_t>(worldSize);
  const int fd = ::shm_open(name.c_str(), O_RDWR | (create ? O_CREAT | O_EXCL : 0), 0600);
  if (fd < 0) {
    throw IoError(fmt::format("shared memory {}: cannot {}: {}", name, create ? "create" : "open",
                              std::strerror(errno)));
  }
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
    const int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw IoError(fmt::format("shared memory {}: cannot size it to {} MB: {} (is /dev/shm big enough?)",
                              name, bytes_ >> 20, std::strerror(e)));
  }
  base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    if (create) ::shm_unlink(name.c_str());
    throw IoError(fmt::format("shared memory {}: cannot map {} MB: {}", name, bytes_ >> 20, std::strerror(e)));
  }
  header_ = static_cast<Header*>(base_);
  if (create) {
    new (header_) Header{};  // the file is zero; this makes the atomics' lifetime explicit
    header_->world = static_cast<uint32_t>(worldSize);
    header_->floatsPerRank = floatsPerRank;
    std::atomic_thread_fence(std::memory_order_release);
    header_->magic = kMagic;
  }
  data_ = reinterpret_cast<float*>(static_cast<char*>(base_) + headerBytes);
  regionStride_ = regionBytes / sizeof(float);
}

ShmAllreduce::~ShmAllreduce() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

void ShmAllreduce::unlink() {
  if (!unlinked_) ::shm_unlink(name_.c_str());
  unlinked_ = true;
}

float* ShmAllreduce::region() const { return data_ + regionStride_ * static_cast<size_t>(rank_); }

void ShmAllreduce::arrive(int phase, uint64_t seq) {
  header_->arrived[phase][rank_].value.store(seq, std::memory_order_release);
  header_->generation[phase].fetch_add(1, std::memory_order_acq_rel);
  futexWakeAll(&header_->generation[phase]);
}

void ShmAllreduce::waitAll(int phase, uint64_t seq, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const uint32_t generation = header_->generation[phase].load(std::memory_order_acquire);
    bool all = true;
    for (int r = 0; r < world_ && all; ++r) {
      all = header_->arrived[phase][r].value.load(std::memory_order_acquire) >= seq;
    }
    if (all) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < world_; ++r) {
        if (header_->arrived[phase][r].value.load(std::memory_order_acquire) < seq) missing.push_back(r);
      }
      throw TimeoutError(fmt::format(
          "rank {}: shared-memory allreduce {} timed out waiting for rank(s) {}", rank_, seq,
          fmt::join(missing, ", ")));
    }
    // Sleep until a rank arrives (the generation changes), at most 10 ms so
    // the deadline is checked.
    const timespec ts{0, 10'000'000};
    futexWait(&header_->generation[phase], generation, &ts);
  }
}

void ShmAllreduce::allreduce(size_t offset, size_t n, std::chrono::milliseconds timeout) {
  COHORT_ASSERT(offset + n <= floatsPerRank_, "range ", offset, "+", n, " past ", floatsPerRank_);
  if (world_ == 1 || n == 0) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const uint64_t seq = ++seq_;
  arrive(0, seq);
  waitAll(0, seq, deadline);
  // This rank's share, in whole cache lines.
  const size_t per = ((n + world_ - 1) / world_ + 15) / 16 * 16;
  const size_t begin = std::min(n, per * static_cast<size_t>(rank_));
  const size_t end = std::min(n, begin + per);
  if (begin < end) {
    float* regions[kMaxRanks];
    for (int r = 0; r < world_; ++r) regions[r] = data_ + regionStride_ * static_cast<size_t>(r) + offset;
    constexpr size_t kBlock = 2048;  // sum a block in a local buffer, then write it to every region
    float sum[kBlock];
    for (size_t at = begin; at < end; at += kBlock) {
      const size_t len = std::min(kBlock, end - at);
      std::memcpy(sum, regions[0] + at, len * sizeof(float));
      for (int r = 1; r < world_; ++r) {
        const float* src = regions[r] + at;
        for (size_t i = 0; i < len; ++i) sum[i] += src[i];
      }
      for (int r = 0; r < world_; ++r) std::memcpy(regions[r] + at, sum, len * sizeof(float));
    }
  }
  arrive(1, seq);
  waitAll(1, seq, deadline);
}

}  // namespace cohort::comm
