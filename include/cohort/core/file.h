#pragma once

// Files that are either complete or absent.

#include <cstddef>
#include <string>

namespace cohort {

// Writes `size` bytes to `path` atomically: a temporary file in the same
// directory, fsync, rename over `path`, fsync of the directory. A crash leaves
// either the old file or the new one, never a torn one. Creates missing
// parent directories. Throws IoError naming the path and the system error.
void writeFileAtomic(const std::string& path, const void* data, size_t size);
inline void writeFileAtomic(const std::string& path, const std::string& text) {
  writeFileAtomic(path, text.data(), text.size());
}

}  // namespace cohort
