#pragma once

// Content checksums: XXH3-64 (xxHash), fast enough to hash a checkpoint on
// the background writer as it is written (several GB/s per core). Printed as
// 16 lower-case hex digits.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace cohort {

class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(Hasher&&) noexcept;
  Hasher& operator=(Hasher&&) noexcept;
  void update(const void* data, size_t size);
  uint64_t digest() const;
  std::string hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The digest of one buffer.
uint64_t checksum(const void* data, size_t size);

std::string checksumHex(uint64_t digest);

// Hashes a whole file. Throws IoError naming the path.
std::string checksumFile(const std::string& path, uint64_t* size = nullptr);

}  // namespace cohort
