#pragma once

// What the shared-memory collectives (comm/shm.h) and channels
// (comm/shm_channel.h) share: a POSIX shared memory segment mapped with
// every page reserved, futex waits on a word in it, and whether a process
// of this machine is still alive.

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>

namespace cohort::comm::detail {

// Creates (`create`, exactly one process; every page reserved, so a full
// /dev/shm fails here and not with SIGBUS later) or opens the segment `name`
// of `bytes` bytes, and maps it. Throws IoError naming it.
void* mapSegment(const std::string& name, size_t bytes, bool create);
void unmapSegment(void* base, size_t bytes);

// Sleeps while *word == expected, at most `timeout`. The word may be shared
// between processes.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, const timespec* timeout);
void futexWakeAll(std::atomic<uint32_t>* word);

// False once `pid` has exited: gone, or a zombie its parent has not reaped.
bool processAlive(pid_t pid);

}  // namespace cohort::comm::detail
