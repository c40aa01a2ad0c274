// ckpt::MappedTensors (mapped_tensors.h).

#include "cohort/ckpt/mapped_tensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "cohort/core/error.h"
#include "cohort/core/fd.h"

namespace cohort::ckpt {

namespace {

constexpr size_t kPage = 4096;

size_t roundUp(size_t n) { return (n + kPage - 1) / kPage * kPage; }

// A file in `dir` without a name: O_TMPFILE, or a name unlinked at once
// where the file system has no O_TMPFILE.
int unnamedFile(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create directory {}: {}", dir, ec.message()));
  int fd = ::open(dir.c_str(), O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  std::string name = (std::filesystem::path(dir) / ".cohort-spill-XXXXXX").string();
  fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) throw IoError(fmt::format("cannot create a temporary file in {}: {}", dir, std::strerror(errno)));
  ::unlink(name.c_str());
  return fd;
}

void writeAt(int fd, const char* p, size_t n, off_t at, const std::string& dir) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      throw IoError(fmt::format("cannot write a temporary file in {}: {}", dir,
                                w < 0 ? std::strerror(errno) : "no progress"));
    }
    p += w;
    n -= static_cast<size_t>(w);
    at += w;
  }
}

struct Placed {
  size_t offset;
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};

}  // namespace

MappedTensors::MappedTensors(TensorSource& source, const std::vector<std::string>& names,
                             const std::string& dir,
                             const std::function<at::Tensor(const at::Tensor&)>& convert) {
  UniqueFd file(unnamedFile(dir));
  std::map<std::string, Placed> placed;
  size_t end = 0;
  for (const std::string& name : names) {
    at::Tensor t = convert(source.load(name)).to(torch::kCPU).contiguous();
    const size_t n = t.nbytes();
    writeAt(file.get(), static_cast<const char*>(t.data_ptr()), n, static_cast<off_t>(end), dir);
    const std::vector<int64_t> sizes = t.sizes().vec();
    const at::ScalarType dtype = t.scalar_type();
    t.reset();
    source.drop(name);  // may give back the storage t was
    // Written back while the next is read: the page cache holds little of it.
    ::sync_file_range(file.get(), static_cast<off_t>(end), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
    placed[name] = {end, sizes, dtype};
    end += roundUp(n);  // each tensor on pages of its own
  }
  size_ = end;
  if (size_ > 0) {
    if (::ftruncate(file.get(), static_cast<off_t>(size_)) != 0) {
      throw IoError(fmt::format("cannot size a temporary file in {}: {}", dir, std::strerror(errno)));
    }
    void* m = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, file.get(), 0);
    if (m == MAP_FAILED) {
      throw IoError(fmt::format("cannot map a temporary file in {}: {}", dir, std::strerror(errno)));
    }
    base_ = static_cast<char*>(m);
  }
  try {
    for (auto& [name, p] : placed) {
      tensors_.emplace(name, torch::from_blob(base_ + p.offset, p.sizes, torch::TensorOptions().dtype(p.dtype)));
    }
  } catch (...) {
    tensors_.clear();
    if (base_ != nullptr) ::munmap(base_, size_);
    throw;
  }
}

MappedTensors::~MappedTensors() {
  tensors_.clear();
  if (base_ != nullptr) ::munmap(base_, size_);
}

void MappedTensors::release(const void* data, size_t size) const {
  const char* p = static_cast<const char*>(data);
  if (base_ == nullptr || p + size <= base_ || p >= base_ + size_) return;
  const char* from = std::max<const char*>(p, base_);
  const char* to = std::min<const char*>(p + size, base_ + size_);
  // Whole pages only: a neighbour's data may share the partial ones.
  const size_t first = roundUp(static_cast<size_t>(from - base_));
  const size_t last = static_cast<size_t>(to - base_) / kPage * kPage;
  if (last > first) ::madvise(base_ + first, last - first, MADV_DONTNEED);
}

}  // namespace cohort::ckpt
