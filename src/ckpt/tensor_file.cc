#include "cohort/ckpt/tensor_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/core/fd.h"
#include "cohort/security/sealed.h"
#include "core/detail/json_int.h"

namespace fs = std::filesystem;

namespace cohort::ckpt {
namespace {

constexpr char kMagic[8] = {'C', 'O', 'H', 'O', 'R', 'T', 'T', 'N'};
constexpr uint64_t kAlign = 64;
constexpr uint64_t kDirectAlign = 4096;

uint64_t alignUp(uint64_t v, uint64_t align = kAlign) { return (v + align - 1) / align * align; }

struct DtypeName {
  c10::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {c10::ScalarType::Float, "float32"},   {c10::ScalarType::Double, "float64"},
    {c10::ScalarType::Half, "float16"},    {c10::ScalarType::BFloat16, "bfloat16"},
    {c10::ScalarType::Long, "int64"},      {c10::ScalarType::Int, "int32"},
    {c10::ScalarType::Short, "int16"},     {c10::ScalarType::Char, "int8"},
    {c10::ScalarType::Byte, "uint8"},      {c10::ScalarType::Bool, "bool"},
};

void readExactly(int fd, void* out, uint64_t size, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, std::min<uint64_t>(size, uint64_t{1} << 30),
                              static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
    if (n == 0) throw DataError(fmt::format("{}: truncated at byte {}", path, offset));
    p += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

struct Parsed {
  nlohmann::json meta;
  std::vector<TensorInfo> tensors;
  std::vector<uint64_t> offsets;
};

// A tensor file's bytes: the file itself, or its plaintext in memory when
// it is sealed (encrypted at rest).
class Source {
 public:
  explicit Source(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_.get() < 0) throw IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) {
      throw IoError(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (security::isSealedFile(path)) {
      plain_ = security::readSealedFile(path, security::installedKeyring());
      sealed_ = true;
      size_ = plain_.size();
    }
  }
  uint64_t size() const { return size_; }
  void read(void* out, uint64_t size, uint64_t offset) const {
    if (!sealed_) return readExactly(fd_.get(), out, size, offset, path_);
    if (offset > size_ || size > size_ - offset) {
      throw DataError(fmt::format("{}: truncated at byte {}", path_, size_));
    }
    std::memcpy(out, plain_.data() + offset, size);
  }

 private:
  std::string path_;
  UniqueFd fd_;
  uint64_t size_ = 0;
  bool sealed_ = false;
  std::string plain_;
};

Parsed parseHeader(const Source& src, const std::string& path) {
  const uint64_t fileSize = src.size();
  char head[16];
  if (fileSize < sizeof head) throw DataError(fmt::format("{}: too short to be a tensor file", path));
  src.read(head, sizeof head, 0);
  if (std::memcmp(head, kMagic, sizeof kMagic) != 0) {
    throw DataError(fmt::format("{}: not a cohort tensor file (bad magic)", path));
  }
  uint64_t headerLen = 0;
  for (int i = 7; i >= 0; --i) headerLen = (headerLen << 8) | static_cast<unsigned char>(head[8 + i]);
  if (headerLen > fileSize - sizeof head) {
    throw DataError(fmt::format("{}: header of {} bytes does not fit in the file ({} bytes)", path,
                                headerLen, fileSize));
  }
  std::string text(headerLen, '\0');
  src.read(text.data(), headerLen, sizeof head);
  Parsed p;
  try {
    const auto h = nlohmann::json::parse(text);
    if (h.value("format", "") != "cohort-tensors") {
      throw DataError(fmt::format("{}: header is not a cohort-tensors header", path));
    }
    const int version = jsonInt<int>(h.at("version"));
    if (version > kTensorFileVersion) {
      throw DataError(fmt::format("{}: tensor file version {} is newer than this cohort reads ({})",
                                  path, version, kTensorFileVersion));
    }
    p.meta = h.value("meta", nlohmann::json::object());
    for (const auto& t : h.at("tensors")) {
      TensorInfo info;
      info.name = t.at("name").get<std::string>();
      info.dtype = t.at("dtype").get<std::string>();
      info.shape = jsonInts<int64_t>(t.at("shape"));
      info.nbytes = jsonInt<uint64_t>(t.at("nbytes"));
      const uint64_t offset = jsonInt<uint64_t>(t.at("offset"));
      uint64_t numel = 1;
      for (int64_t d : info.shape) {
        if (d < 0) throw DataError(fmt::format("{}: tensor '{}' has a negative size", path, info.name));
        if (d > 0 && numel > fileSize / static_cast<uint64_t>(d)) {
          throw DataError(fmt::format("{}: tensor '{}' has a shape larger than the file", path,
                                      info.name));
        }
        numel *= static_cast<uint64_t>(d);
      }
      c10::ScalarType type{};
      try {
        type = dtypeFromName(info.dtype);
      } catch (const DataError& e) {
        throw DataError(fmt::format("{}: tensor '{}': {}", path, info.name, e.what()));
      }
      const uint64_t expected = numel * c10::elementSize(type);
      if (expected != info.nbytes) {
        throw DataError(fmt::format("{}: tensor '{}' claims {} bytes, its shape needs {}", path,
                                    info.name, info.nbytes, expected));
      }
      if (offset > fileSize || info.nbytes > fileSize - offset) {
        throw DataError(fmt::format("{}: tensor '{}' lies beyond the end of the file (truncated?)",
                                    path, info.name));
      }
      p.tensors.push_back(std::move(info));
      p.offsets.push_back(offset);
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: unreadable header: {}", path, e.what()));
  }
  return p;
}

}  // namespace

std::string dtypeName(c10::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.name;
  }
  throw DataError(fmt::format("tensor type {} cannot be saved", c10::toString(t)));
}

c10::ScalarType dtypeFromName(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  throw DataError(fmt::format("unknown tensor type '{}'", name));
}

TensorFileLayout layoutTensorFile(const std::vector<TensorRecord>& records,
                                  const nlohmann::json& meta, uint64_t align) {
  // The offsets depend on the header's length: reserve room for the header,
  // growing it until the header with those offsets fits.
  for (uint64_t reserve = 4096;; reserve *= 2) {
    TensorFileLayout l;
    nlohmann::json header = {{"format", "cohort-tensors"}, {"version", kTensorFileVersion}, {"meta", meta}};
    auto list = nlohmann::json::array();
    uint64_t offset = alignUp(16 + reserve, align);
    for (const auto& r : records) {
      l.offsets.push_back(offset);
      list.push_back({{"name", r.name}, {"dtype", dtypeName(r.dtype)}, {"shape", r.shape},
                      {"offset", offset}, {"nbytes", r.nbytes}});
      offset = alignUp(offset + r.nbytes, align);
    }
    header["tensors"] = std::move(list);
    const std::string text = header.dump();
    if (text.size() > reserve) continue;
    l.header.assign(kMagic, sizeof kMagic);
    for (int i = 0; i < 8; ++i) l.header.push_back(static_cast<char>(text.size() >> (8 * i)));
    l.header += text;
    l.size = std::max(offset, alignUp(l.header.size(), align));
    return l;
  }
}

namespace {

// Opens the temporary file next to `path`; fills `tmp`.
int openTemporary(const std::string& path, std::string& tmp, bool direct) {
  const fs::path target(path);
  tmp = (target.parent_path() / (".tmp." + target.filename().string() + "." + std::to_string(getpid())))
            .string();
  return ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
}

// fsync, rename over `path`, fsync the directory.
void commitTemporary(int fd, const std::string& tmp, const std::string& path) {
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("cannot sync {}: {}", path, std::strerror(err)));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("cannot rename into {}: {}", path, std::strerror(err)));
  }
  const fs::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) ::fsync(dfd.get());
}

}  // namespace

namespace {

// Fills dst with bytes [at, at + n) of a file whose bytes [start, start +
// len) are `src`: the overlap only.
void copyOverlap(const void* src, uint64_t start, uint64_t len, uint64_t at, uint64_t n, char* dst) {
  const uint64_t from = std::max(start, at), to = std::min(start + len, at + n);
  if (from < to) std::memcpy(dst + (from - at), static_cast<const char*>(src) + (from - start), to - from);
}

}  // namespace

WrittenFile writeTensorFile(const std::string& path, const std::vector<TensorRecord>& records,
                            const nlohmann::json& meta, const security::Key* key) {
  // Streamed from the records' memory through a bounded buffer: writing a
  // rank's state (ZeRO stage 3, in place) needs no second copy of it.
  const TensorFileLayout l = layoutTensorFile(records, meta, kAlign);
  return writeFileFrom(path, l.size, [&](uint64_t at, uint64_t n, char* dst) {
    std::memset(dst, 0, n);
    copyOverlap(l.header.data(), 0, l.header.size(), at, n, dst);
    for (size_t i = 0; i < records.size(); ++i) {
      if (records[i].nbytes > 0) copyOverlap(records[i].data, l.offsets[i], records[i].nbytes, at, n, dst);
    }
  }, key);
}

namespace {

// A write failed with `err`: the temporary file goes, the error names `path`.
[[noreturn]] void abandonWrite(int fd, const std::string& tmp, const std::string& path, int err) {
  ::close(fd);
  ::unlink(tmp.c_str());
  throw IoError(fmt::format("cannot write {}: {}", path, std::strerror(err)));
}

// Sealed bytes travel from the sealing thread to a writer thread in aligned
// buffers, so that sealing one buffer overlaps writing the previous one, and
// the writes can bypass the page cache (O_DIRECT) as a plain file's do.
class SealedPipe {
 public:
  static constexpr size_t kBuffer = size_t{8} << 20;

  SealedPipe(int fd, bool direct) : fd_(fd), direct_(direct) {
    for (auto& b : buffers_) {
      void* p = nullptr;
      // Room for a whole chunk past the buffer's size: it fills, then is cut.
      if (::posix_memalign(&p, kDirectAlign, kBuffer + security::kDefaultChunkBytes + 4096) != 0) {
        throw std::bad_alloc();
      }
      b.reset(static_cast<char*>(p));
    }
    writer_ = std::thread([this] { writeLoop(); });
  }
  ~SealedPipe() { finish(); }

  // Where the next `n` sealed bytes go.
  char* reserve(size_t n) {
    if (fill_ + n > kBuffer + security::kDefaultChunkBytes + 4096) hand(false);
    return buffers_[current_].get() + fill_;
  }
  void commit(size_t n) {
    fill_ += n;
    if (fill_ >= kBuffer) hand(false);
  }
  // Hands over what is left, waits for every write; the first failure's errno (0: none).
  int finish() {
    if (writer_.joinable()) {
      hand(true);
      {
        std::lock_guard<std::mutex> g(mutex_);
        stop_ = true;
      }
      cv_.notify_all();
      writer_.join();
    }
    return error_;
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };

  // Gives the current buffer (its aligned part, or all of it when `last`) to
  // the writer and carries the unaligned rest into the other buffer.
  void hand(bool last) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return pending_ == nullptr; });
    const size_t size = last || !direct_ ? fill_ : fill_ / kDirectAlign * kDirectAlign;
    pending_ = buffers_[current_].get();
    pendingSize_ = size;
    const size_t rest = fill_ - size;
    char* next = buffers_[current_ ^ 1].get();
    if (rest > 0) std::memcpy(next, pending_ + size, rest);
    current_ ^= 1;
    fill_ = rest;
    lock.unlock();
    cv_.notify_all();
  }

  void writeLoop() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return pending_ != nullptr || stop_; });
      if (pending_ == nullptr) return;
      const char* p = pending_;
      size_t left = pendingSize_;
      lock.unlock();
      while (left > 0 && error_ == 0) {
        size_t n = left;
        if (direct_ && n % kDirectAlign != 0) {
          // The end of the file is not a whole block: its tail goes through the cache.
          n = n / kDirectAlign * kDirectAlign;
          if (n == 0) {
            dropDirect();
            continue;
          }
        }
        const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EINVAL && direct_) {
          dropDirect();  // the file system refuses direct I/O after all
          continue;
        }
        if (w < 0) {
          error_ = errno;
          break;
        }
        p += w;
        left -= static_cast<size_t>(w);
      }
      lock.lock();
      pending_ = nullptr;
      lock.unlock();
      cv_.notify_all();
    }
  }

  void dropDirect() {
    const int flags = ::fcntl(fd_, F_GETFL);
    ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
    direct_ = false;
  }

  int fd_;
  std::atomic<bool> direct_;  // cleared by the writer for the tail, or when refused
  std::unique_ptr<char, Free> buffers_[2];
  int current_ = 0;
  size_t fill_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  const char* pending_ = nullptr;
  size_t pendingSize_ = 0;
  bool stop_ = false;
  std::atomic<int> error_{0};
  std::thread writer_;
};

// The image sealed chunk by chunk, sealing overlapped with writing
// (SealedPipe); the checksum over what reaches the disk.
WrittenFile writeSealedImage(const std::string& path, const void* data, uint64_t size,
                             const std::function<void()>& beforeCommit, const security::Key& key,
                             const FileFill* fill = nullptr) {
  security::Sealer sealer(key, security::sealedLabel(path), size);
  std::string tmp;
  int fd = openTemporary(path, tmp, true);
  const bool direct = fd >= 0;
  if (!direct) fd = openTemporary(path, tmp, false);
  if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
  WrittenFile out;
  out.name = fs::path(path).filename().string();
  out.size = sealer.sealedBytes();
  Hasher h;
  int err = 0;
  try {
    SealedPipe pipe(fd, direct);
    std::memcpy(pipe.reserve(sealer.header().size()), sealer.header().data(), sealer.header().size());
    h.update(sealer.header().data(), sealer.header().size());
    pipe.commit(sealer.header().size());
    const char* p = static_cast<const char*>(data);
    std::string plain;  // a chunk's plaintext, when filled rather than in `data`
    uint64_t at = 0;
    for (uint64_t i = 0; i < sealer.chunks(); ++i) {
      const size_t n = sealer.sealedLength(i);
      if (fill != nullptr) {
        plain.resize(sealer.plainLength(i));
        (*fill)(at, plain.size(), plain.data());
        at += plain.size();
        p = plain.data();
      }
      char* dst = pipe.reserve(n);
      sealer.seal(i, p, dst);
      h.update(dst, n);
      pipe.commit(n);
      if (fill == nullptr) p += sealer.plainLength(i);
      if (beforeCommit && i == sealer.chunks() / 2) beforeCommit();  // the test hook, half written
    }
    err = pipe.finish();
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (err != 0) abandonWrite(fd, tmp, path, err);
  out.checksum = h.hex();
  commitTemporary(fd, tmp, path);
  return out;
}

}  // namespace

WrittenFile writeFileImage(const std::string& path, const void* data, uint64_t size,
                           const std::function<void()>& beforeCommit, const security::Key* key) {
  if (key != nullptr) return writeSealedImage(path, data, size, beforeCommit, *key);
  const bool aligned = reinterpret_cast<uintptr_t>(data) % kDirectAlign == 0 && size % kDirectAlign == 0;
  std::string tmp;
  int fd = aligned ? openTemporary(path, tmp, true) : -1;
  bool direct = fd >= 0;
  if (!direct) fd = openTemporary(path, tmp, false);
  if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
  WrittenFile out;
  out.name = fs::path(path).filename().string();
  out.size = size;
  Hasher h;
  h.update(data, size);
  out.checksum = h.hex();
  const char* p = static_cast<const char*>(data);
  uint64_t left = size;
  bool half = false;
  while (left > 0) {
    // Chunks keep each direct write a bounded, aligned size.
    const uint64_t chunk = std::min<uint64_t>(left, uint64_t{64} << 20);
    ssize_t n = ::write(fd, p, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && direct) {
      // The file system refuses direct I/O after all: start over buffered.
      ::close(fd);
      ::unlink(tmp.c_str());
      fd = openTemporary(path, tmp, false);
      if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
      direct = false;
      p = static_cast<const char*>(data);
      left = size;
      continue;
    }
    if (n < 0) abandonWrite(fd, tmp, path, errno);
    p += n;
    left -= static_cast<uint64_t>(n);
    if (!half && left <= size / 2 && beforeCommit) {
      half = true;
      beforeCommit();  // the test hook runs with the file half written
    }
  }
  commitTemporary(fd, tmp, path);
  return out;
}

WrittenFile writeFileFrom(const std::string& path, uint64_t size, const FileFill& fill,
                          const security::Key* key) {
  if (key != nullptr) return writeSealedImage(path, nullptr, size, nullptr, *key, &fill);
  std::string tmp;
  const int fd = openTemporary(path, tmp, false);
  if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
  WrittenFile out;
  out.name = fs::path(path).filename().string();
  out.size = size;
  Hasher h;
  std::string buffer(static_cast<size_t>(std::min<uint64_t>(size, uint64_t{8} << 20)), '\0');
  for (uint64_t at = 0; at < size;) {
    const uint64_t n = std::min<uint64_t>(size - at, buffer.size());
    fill(at, n, buffer.data());
    h.update(buffer.data(), n);
    for (uint64_t done = 0; done < n;) {
      const ssize_t w = ::write(fd, buffer.data() + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) abandonWrite(fd, tmp, path, errno);
      done += static_cast<uint64_t>(w);
    }
    at += n;
  }
  out.checksum = h.hex();
  commitTemporary(fd, tmp, path);
  return out;
}

struct TensorFileReader::State {
  State(const std::string& path) : src(path), parsed(parseHeader(src, path)), path(path) {
    for (size_t i = 0; i < parsed.tensors.size(); ++i) index.emplace(parsed.tensors[i].name, i);
  }
  Source src;
  Parsed parsed;
  std::string path;
  std::map<std::string, size_t> index;
  uint64_t bytesRead = 0;
};

TensorFileReader::TensorFileReader(const std::string& path) : state_(std::make_unique<State>(path)) {}
TensorFileReader::~TensorFileReader() = default;
TensorFileReader::TensorFileReader(TensorFileReader&&) noexcept = default;
TensorFileReader& TensorFileReader::operator=(TensorFileReader&&) noexcept = default;
const std::string& TensorFileReader::path() const { return state_->path; }
const nlohmann::json& TensorFileReader::meta() const { return state_->parsed.meta; }
const std::vector<TensorInfo>& TensorFileReader::tensors() const { return state_->parsed.tensors; }
bool TensorFileReader::has(const std::string& name) const { return state_->index.count(name) != 0; }

at::Tensor TensorFileReader::read(const std::string& name) const {
  auto it = state_->index.find(name);
  if (it == state_->index.end()) throw DataError(fmt::format("{}: no tensor '{}'", state_->path, name));
  return read(it->second);
}

at::Tensor TensorFileReader::read(size_t index) const {
  const TensorInfo& info = state_->parsed.tensors.at(index);
  at::Tensor t = torch::empty(info.shape, torch::TensorOptions().dtype(dtypeFromName(info.dtype)));
  state_->src.read(t.data_ptr(), info.nbytes, state_->parsed.offsets[index]);
  state_->bytesRead += info.nbytes;
  return t;
}

at::Tensor TensorFileReader::readRange(const std::string& name, int64_t dim, int64_t begin, int64_t end) const {
  auto it = state_->index.find(name);
  if (it == state_->index.end()) throw DataError(fmt::format("{}: no tensor '{}'", state_->path, name));
  const TensorInfo& info = state_->parsed.tensors.at(it->second);
  const auto dims = static_cast<int64_t>(info.shape.size());
  if (dim < 0 || dim >= dims || begin < 0 || end < begin || end > info.shape[static_cast<size_t>(dim)]) {
    throw DataError(fmt::format("{}: tensor '{}' of shape [{}] has no indices [{}, {}) along dimension {}", state_->path,
                                name, fmt::join(info.shape, ", "), begin, end, dim));
  }
  // [outer, size, inner] elements around `dim`.
  uint64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= static_cast<uint64_t>(info.shape[static_cast<size_t>(d)]);
  for (int64_t d = dim + 1; d < dims; ++d) inner *= static_cast<uint64_t>(info.shape[static_cast<size_t>(d)]);
  const auto size = static_cast<uint64_t>(info.shape[static_cast<size_t>(dim)]);
  std::vector<int64_t> shape = info.shape;
  shape[static_cast<size_t>(dim)] = end - begin;
  at::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(dtypeFromName(info.dtype)));
  const uint64_t element = static_cast<uint64_t>(t.element_size());
  const uint64_t run = static_cast<uint64_t>(end - begin) * inner * element;  // one leading index's region
  auto* out = static_cast<char*>(t.data_ptr());
  for (uint64_t o = 0; o < outer && run > 0; ++o) {
    state_->src.read(out + o * run, run,
                     state_->parsed.offsets[it->second] + (o * size + static_cast<uint64_t>(begin)) * inner * element);
  }
  state_->bytesRead += run * outer;
  return t;
}

uint64_t TensorFileReader::bytesRead() const { return state_->bytesRead; }

std::vector<TensorInfo> readTensorFileInfo(const std::string& path, nlohmann::json* meta) {
  TensorFileReader f(path);
  if (meta) *meta = f.meta();
  return f.tensors();
}

void visitTensorFile(const std::string& path, const std::function<bool(const TensorInfo&)>& wanted,
                     const std::function<void(const std::string&, at::Tensor)>& visit) {
  const TensorFileReader f(path);
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    if (wanted && !wanted(f.tensors()[i])) continue;
    visit(f.tensors()[i].name, f.read(i));
  }
}

TensorFile readTensorFile(const std::string& path) {
  const TensorFileReader f(path);
  TensorFile out;
  out.meta = f.meta();
  for (size_t i = 0; i < f.tensors().size(); ++i) out.tensors.emplace_back(f.tensors()[i].name, f.read(i));
  return out;
}

}  // namespace cohort::ckpt
