#include "cohort/comm/shm_channel.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>

#include "cohort/comm/wait.h"
#include "cohort/core/error.h"
#include "comm/detail/segment.h"

namespace cohort::comm {

namespace {

constexpr uint32_t kChannelMagic = 0x53484d43;  // "SHMC"

}  // namespace

// The ring's state. `written` and `read` count messages; message k is in
// slot k % slots. The writer alone advances `written`, the reader `read`;
// each bumps `word` after and wakes whoever sleeps on it.
struct ShmChannel::Header {
  uint32_t magic;
  uint32_t slots;
  uint64_t slotBytes;
  alignas(64) std::atomic<uint64_t> written;
  alignas(64) std::atomic<uint64_t> read;
  alignas(64) std::atomic<uint32_t> word;
  std::atomic<int32_t> pid[2];  // writer's, reader's: a side that exited is noticed
};
// After the header: each slot's message size (so that a mismatch is an
// error, not garbage), then the slots.

ShmChannel::ShmChannel(const std::string& name, size_t slotBytes, int slots, bool writer)
    : name_(name), slotBytes_(slotBytes), slots_(slots), writer_(writer) {
  COHORT_ASSERT(slots >= 1 && slotBytes >= 1, slots, " slots of ", slotBytes, " bytes");
  const size_t sizesAt = (sizeof(Header) + 63) / 64 * 64;
  const size_t headerBytes =
      (sizesAt + sizeof(std::atomic<uint64_t>) * static_cast<size_t>(slots) + 4095) / 4096 * 4096;
  slotStride_ = (slotBytes + 63) / 64 * 64;
  bytes_ = headerBytes + slotStride_ * static_cast<size_t>(slots);
  base_ = detail::mapSegment(name, bytes_, writer);
  header_ = static_cast<Header*>(base_);
  sizes_ = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(base_) + sizesAt);
  if (writer) {
    // The file is zero; this makes the atomics' lifetime explicit.
    new (header_) Header{};
    for (int k = 0; k < slots; ++k) new (&sizes_[k]) std::atomic<uint64_t>(0);
    header_->slots = static_cast<uint32_t>(slots);
    header_->slotBytes = slotBytes;
    std::atomic_thread_fence(std::memory_order_release);
    header_->magic = kChannelMagic;
  } else if (header_->magic != kChannelMagic || header_->slots != static_cast<uint32_t>(slots) ||
             header_->slotBytes != slotBytes) {
    const uint32_t s = header_->slots;
    const uint64_t b = header_->slotBytes;
    detail::unmapSegment(base_, bytes_);
    base_ = nullptr;
    throw IoError(fmt::format("shared memory {}: made for {} slots of {} bytes, not {} of {}", name, s, b,
                              slots, slotBytes));
  }
  header_->pid[writer ? 0 : 1].store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  data_ = static_cast<char*>(base_) + headerBytes;
}

ShmChannel::~ShmChannel() {
  if (writer_) unlink();
  if (base_ != nullptr) detail::unmapSegment(base_, bytes_);
}

void ShmChannel::unlink() {
  if (!unlinked_) ::shm_unlink(name_.c_str());
  unlinked_ = true;
}

template <class Ready>
void ShmChannel::waitUntil(Ready ready, std::chrono::milliseconds timeout, const std::string& peer,
                           const char* what) {
  if (ready()) return;
  CollectiveWait waiting(what);  // for the stall inspector (monitor/watchdog.h)
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const int other = writer_ ? 1 : 0;
  for (;;) {
    const uint32_t word = header_->word.load(std::memory_order_acquire);
    if (ready()) return;
    // The other side's pid is 0 until it has opened the segment.
    const pid_t pid = header_->pid[other].load(std::memory_order_acquire);
    if (pid > 0 && !detail::processAlive(pid) && !ready()) {
      throw CommError(fmt::format("{}: {} (pid {}) has exited", what, peer, pid));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TimeoutError(fmt::format("{}: {} did not {} within {} s", what, peer,
                                     writer_ ? "read" : "write", timeout.count() / 1000.0));
    }
    // Sleep until the other side moves (the word changes), at most 10 ms
    // so that its process and the deadline are checked.
    const timespec ts{0, 10'000'000};
    detail::futexWait(&header_->word, word, &ts);
  }
}

void ShmChannel::write(const void* data, size_t n, std::chrono::milliseconds timeout, const std::string& peer) {
  COHORT_ASSERT(n <= slotBytes_, "a message of ", n, " bytes for slots of ", slotBytes_);
  const uint64_t k = header_->written.load(std::memory_order_relaxed);
  waitUntil([&] { return k - header_->read.load(std::memory_order_acquire) < static_cast<uint64_t>(slots_); },
            timeout, peer, "shared-memory channel: waiting for a free slot");
  const size_t slot = static_cast<size_t>(k % static_cast<uint64_t>(slots_));
  std::memcpy(data_ + slot * slotStride_, data, n);
  sizes_[slot].store(n, std::memory_order_relaxed);
  header_->written.store(k + 1, std::memory_order_release);
  header_->word.fetch_add(1, std::memory_order_acq_rel);
  detail::futexWakeAll(&header_->word);
}

void ShmChannel::read(void* data, size_t n, std::chrono::milliseconds timeout, const std::string& peer) {
  const uint64_t k = header_->read.load(std::memory_order_relaxed);
  waitUntil([&] { return header_->written.load(std::memory_order_acquire) > k; }, timeout, peer,
            "shared-memory channel: waiting for a message");
  const size_t slot = static_cast<size_t>(k % static_cast<uint64_t>(slots_));
  const uint64_t size = sizes_[slot].load(std::memory_order_relaxed);
  if (size != n) {
    throw CommError(fmt::format("shared-memory channel {}: message {} from {} is {} bytes, {} expected",
                                name_, k, peer, size, n));
  }
  std::memcpy(data, data_ + slot * slotStride_, n);
  header_->read.store(k + 1, std::memory_order_release);
  header_->word.fetch_add(1, std::memory_order_acq_rel);
  detail::futexWakeAll(&header_->word);
}

}  // namespace cohort::comm
