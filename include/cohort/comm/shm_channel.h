#pragma once

// One-way messages from one process to another on the same machine through
// a ring of slots in a shared memory segment: the writer copies a message
// into the next free slot and goes on, waiting only when every slot holds a
// message not yet read; the reader copies the next message out, waiting
// until there is one. One copy on each side, no sockets. A pipeline's
// neighbouring stages pass activations and gradients this way
// (parallel/pipeline.h).
//
//   writer                              reader
//   ShmChannel(name, bytes, slots, true)
//   (tell the reader the name)    ->    ShmChannel(name, bytes, slots, false); unlink()
//   write(p, n)                   ->    read(q, n)      (n <= slotBytes; both know n)
//
// Waiting uses a futex in the segment (no spinning). A wait fails with
// CommError as soon as the other process has exited, and with TimeoutError
// after `timeout`. This header does not include LibTorch.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort::comm {

class ShmChannel {
 public:
  // The writer creates the segment `name` (every page reserved: IoError
  // when /dev/shm is too small); the reader opens it (IoError when it is
  // missing or made for other sizes).
  ShmChannel(const std::string& name, size_t slotBytes, int slots, bool writer);
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // Removes the name (the memory lives on while mapped); once both sides
  // have it mapped, so that a crash leaves nothing in /dev/shm.
  void unlink();
  size_t slotBytes() const { return slotBytes_; }

  // Writer: `n` bytes (at most slotBytes()) into the next slot. Blocks while
  // every slot is unread. `peer` names the reader in errors.
  void write(const void* data, size_t n, std::chrono::milliseconds timeout, const std::string& peer);
  // Reader: the next message, of `n` bytes, into `data`. Blocks until it is
  // there. Throws CommError when the message written had another size.
  void read(void* data, size_t n, std::chrono::milliseconds timeout, const std::string& peer);

 private:
  struct Header;
  // Waits until `ready()` holds; the other side's pid tells whether it lives.
  template <class Ready>
  void waitUntil(Ready ready, std::chrono::milliseconds timeout, const std::string& peer, const char* what);

  std::string name_;
  size_t slotBytes_;
  int slots_;
  bool writer_;
  size_t bytes_ = 0;
  void* base_ = nullptr;
  Header* header_ = nullptr;
  std::atomic<uint64_t>* sizes_ = nullptr;
  char* data_ = nullptr;
  size_t slotStride_ = 0;
  bool unlinked_ = false;
};

}  // namespace cohort::comm
