#include "cohort/ckpt/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "cohort/core/error.h"
#include "cohort/core/file.h"

namespace cohort::ckpt {
namespace {

using nlohmann::json;

uint64_t readLength(const unsigned char* b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

void preadAll(int fd, void* into, uint64_t size, uint64_t at, const std::string& path) {
  auto* p = static_cast<char*>(into);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw DataError(fmt::format("{}: truncated: {} bytes missing at offset {}", path, size, at));
    }
    p += n;
    size -= static_cast<uint64_t>(n);
    at += static_cast<uint64_t>(n);
  }
}

}  // namespace

bool isSafetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  unsigned char head[9];
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::pread(fd, head, 9, 0) == 9;
  ::close(fd);
  if (!ok) return false;
  const uint64_t n = readLength(head);
  return n >= 2 && n <= kSafetensorsMaxHeader && n <= static_cast<uint64_t>(st.st_size) - 8 && head[8] == '{';
}

struct SafetensorsFile::State {
  std::string path;
  int fd = -1;
  uint64_t dataStart = 0;
  SafetensorsHeader header;
  StateDict entries;
  std::map<std::string, const SafetensorsEntry*> byName;
  ~State() {
    if (fd >= 0) ::close(fd);
  }
};

SafetensorsFile::SafetensorsFile(std::string path) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.path = std::move(path);
  s.fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (s.fd < 0) throw DataError(fmt::format("{}: cannot open: {}", s.path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(s.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw DataError(fmt::format("{}: not a regular file", s.path));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) throw DataError(fmt::format("{}: {} bytes: too short for a safetensors file", s.path, size));
  unsigned char head[8];
  preadAll(s.fd, head, 8, 0, s.path);
  const uint64_t n = readLength(head);
  if (n > kSafetensorsMaxHeader || n > size - 8) {
    throw DataError(fmt::format("{}: a safetensors header of {} bytes does not fit (the file has {}, the limit is {})",
                                s.path, n, size, kSafetensorsMaxHeader));
  }
  std::string text(n, '\0');
  preadAll(s.fd, text.data(), n, 8, s.path);
  if (text.empty() || text[0] != '{') throw DataError(fmt::format("{}: not a safetensors file (no JSON header)", s.path));
  s.dataStart = 8 + n;
  s.header = parseSafetensorsHeader(text, size - s.dataStart, s.path);
  for (const SafetensorsEntry& e : s.header.tensors) {
    s.entries.emplace_back(e.name, withoutData(e.shape, e.dtype));
    s.byName[e.name] = &e;
  }
}

SafetensorsFile::~SafetensorsFile() = default;

const StateDict& SafetensorsFile::entries() const { return state_->entries; }

const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return state_->header.metadata; }

at::Tensor SafetensorsFile::load(const std::string& name) {
  State& s = *state_;
  auto it = s.byName.find(name);
  if (it == s.byName.end()) throw DataError(fmt::format("{}: no tensor '{}'", s.path, name));
  const SafetensorsEntry& e = *it->second;
  at::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
  try {
    preadAll(s.fd, t.data_ptr(), e.end - e.begin, s.dataStart + e.begin, s.path);
  } catch (const DataError& err) {
    throw DataError(fmt::format("{} (tensor '{}')", err.what(), name));
  }
  return t;
}

void SafetensorsFile::drop(const std::string&) {}  // load() hands over its only copy

struct SafetensorsWriter::State {
  std::string path;
  std::map<std::string, std::string> metadata;
  std::string scratch;
  int fd = -1;
  uint64_t written = 0;
  std::vector<SafetensorsEntry> tensors;
  std::vector<std::string> tied;
  ~State() {
    if (fd >= 0) ::close(fd);
    if (!scratch.empty()) ::unlink(scratch.c_str());
  }
};

SafetensorsWriter::SafetensorsWriter(std::string path, std::map<std::string, std::string> metadata)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.path = std::move(path);
  s.metadata = std::move(metadata);
  s.metadata.emplace("format", "pt");  // what Hugging Face's torch helpers write
  s.scratch = s.path + ".data.XXXXXX";
  std::vector<char> name(s.scratch.begin(), s.scratch.end());
  name.push_back('\0');
  s.fd = ::mkstemp(name.data());
  if (s.fd < 0) {
    const std::string why = std::strerror(errno);
    s.scratch.clear();
    throw IoError(fmt::format("{}: cannot create a scratch file beside it: {}", s.path, why));
  }
  s.scratch = name.data();
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::add(const std::string& name, const at::Tensor& t) {
  State& s = *state_;
  if (std::any_of(s.tensors.begin(), s.tensors.end(), [&](const auto& e) { return e.name == name; })) {
    throw Error(fmt::format("{}: tensor '{}' added twice", s.path, name));
  }
  const at::Tensor c = t.detach().to(torch::kCPU).contiguous();
  SafetensorsEntry e{name, c.scalar_type(), c.sizes().vec(), s.written, s.written + c.nbytes()};
  (void)safetensorsDtypeName(e.dtype);
  const char* p = static_cast<const char*>(c.data_ptr());
  for (size_t left = c.nbytes(); left > 0;) {
    const ssize_t n = ::write(s.fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(fmt::format("{}: writing tensor '{}': {}", s.path, name, std::strerror(errno)));
    p += n;
    left -= static_cast<size_t>(n);
  }
  s.written = e.end;
  s.tensors.push_back(std::move(e));
}

void SafetensorsWriter::alias(const std::string& name, const std::string& of) {
  state_->tied.push_back(name + "=" + of);
}

void SafetensorsWriter::finish(const std::vector<std::string>& order) {
  State& s = *state_;
  std::vector<const SafetensorsEntry*> listed;
  if (order.empty()) {
    for (const auto& e : s.tensors) listed.push_back(&e);
  } else {
    // Every added tensor's bytes are in the data: each must be listed.
    for (const auto& e : s.tensors) {
      if (std::find(order.begin(), order.end(), e.name) == order.end()) {
        throw Error(fmt::format("{}: tensor '{}' was added but is not in the order", s.path, e.name));
      }
    }
    for (const std::string& name : order) {
      auto it = std::find_if(s.tensors.begin(), s.tensors.end(), [&](const auto& e) { return e.name == name; });
      if (it != s.tensors.end()) {
        listed.push_back(&*it);
      } else if (std::none_of(s.tied.begin(), s.tied.end(), [&](const auto& t) { return t.rfind(name + "=", 0) == 0; })) {
        throw Error(fmt::format("{}: tensor '{}' was never added", s.path, name));
      }
    }
  }
  if (!s.tied.empty()) s.metadata["tied"] = fmt::format("{}", fmt::join(s.tied, ","));
  nlohmann::ordered_json h;
  h["__metadata__"] = s.metadata;
  for (const SafetensorsEntry* e : listed) {
    h[e->name] = {{"dtype", safetensorsDtypeName(e->dtype)}, {"shape", e->shape}, {"data_offsets", {e->begin, e->end}}};
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((uint64_t{text.size()} >> (8 * i)) & 0xff);
  AtomicFile out(s.path);
  out.write(len, 8);
  out.write(text.data(), text.size());
  std::vector<char> buffer(size_t{4} << 20);
  for (uint64_t at = 0; at < s.written;) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), s.written - at);
    preadAll(s.fd, buffer.data(), n, at, s.scratch);
    out.write(buffer.data(), n);
    at += n;
  }
  out.commit();
}

void saveSafetensors(const StateDict& dict, const std::string& path, const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w(path, metadata);
  // A tensor is the one written before it when it has its data, dtype,
  // shape and strides (the tied head), not merely a storage in common
  // (views of one buffer, a transpose).
  std::map<std::tuple<const void*, at::ScalarType, std::vector<int64_t>, std::vector<int64_t>>, std::string> seen;
  for (const auto& [name, t] : dict) {
    const auto key = std::make_tuple(static_cast<const void*>(t.data_ptr()), t.scalar_type(), t.sizes().vec(),
                                     t.strides().vec());
    auto it = seen.find(key);
    if (it != seen.end() && t.numel() > 0) {
      w.alias(name, it->second);
      continue;
    }
    seen.emplace(key, name);
    w.add(name, t);
  }
  w.finish();
}

}  // namespace cohort::ckpt
