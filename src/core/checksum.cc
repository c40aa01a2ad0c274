#include "cohort/core/checksum.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "cohort/core/error.h"

namespace cohort {

struct Hasher::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

Hasher::Hasher() : state_(std::make_unique<State>()) {
  if (state_->s == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state_->s);
}
Hasher::~Hasher() = default;
Hasher::Hasher(Hasher&&) noexcept = default;
Hasher& Hasher::operator=(Hasher&&) noexcept = default;

void Hasher::update(const void* data, size_t size) { XXH3_64bits_update(state_->s, data, size); }
uint64_t Hasher::digest() const { return XXH3_64bits_digest(state_->s); }

uint64_t checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }
std::string Hasher::hex() const { return checksumHex(digest()); }

std::string checksumHex(uint64_t digest) { return fmt::format("{:016x}", digest); }

std::string checksumFile(const std::string& path, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  Hasher h;
  std::vector<char> buf(size_t{4} << 20);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw IoError(fmt::format("cannot read {}: {}", path, std::strerror(err)));
    }
    if (n == 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  if (size) *size = total;
  return h.hex();
}

}  // namespace cohort
