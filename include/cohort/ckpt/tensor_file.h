#pragma once

// cohort's tensor file: named tensors as raw bytes behind a JSON header, so a
// checkpoint is written straight from host buffers, with no serialization
// copy, and read back with one read per tensor. docs/checkpoint-format.md
// describes the layout:
//
//   "COHORTTN"  u64 little-endian header length  header (JSON)  zero padding
//   tensor data, each tensor starting at a multiple of 64 bytes (4096 in
//   checkpoints, for direct I/O)
//
// The header: {"format": "cohort-tensors", "version": 1, "meta": {...},
// "tensors": [{"name", "dtype", "shape", "offset", "nbytes"}, ...]}.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/security/keys.h"

namespace cohort::ckpt {

inline constexpr int kTensorFileVersion = 1;

// One tensor to write: contiguous bytes somewhere in memory.
struct TensorRecord {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// Where everything goes in a tensor file: `header` is the file's first bytes
// (magic, length, JSON); tensor i starts at offsets[i]; the file is `size`
// bytes, a multiple of `align` (zero padding between and after tensors).
struct TensorFileLayout {
  std::string header;
  std::vector<uint64_t> offsets;
  uint64_t size = 0;
};
// Only the records' names, types, shapes and sizes are used.
TensorFileLayout layoutTensorFile(const std::vector<TensorRecord>& records,
                                  const nlohmann::json& meta, uint64_t align);

struct WrittenFile {
  std::string name;      // file name (no directory)
  uint64_t size = 0;     // bytes
  std::string checksum;  // XXH3-64 hex of the whole file
};

// Writes the records to `path` atomically (temporary file, fsync, rename,
// fsync of the directory), with its checksum; sealed with `key` when given
// (as writeFileImage). Streamed from the records' memory through a buffer
// of a few MB (no image of the file in memory). Throws IoError naming the
// path.
WrittenFile writeTensorFile(const std::string& path, const std::vector<TensorRecord>& records,
                            const nlohmann::json& meta, const security::Key* key = nullptr);

// Writes a whole file image (a layout filled in) to `path` atomically, with
// direct I/O (no copy into the page cache) when `data` and `size` are
// multiples of 4096 and the file system allows it, else buffered. With a
// `key`, the file is sealed (cohort/security/sealed.h: AES-256-GCM in
// chunks, authenticated as <parent dir>/<name>); size and checksum are then
// those of the sealed file on disk.
WrittenFile writeFileImage(const std::string& path, const void* data, uint64_t size,
                           const std::function<void()>& beforeCommit = nullptr,
                           const security::Key* key = nullptr);

// A file streamed rather than held whole: fill(at, n, dst) puts bytes
// [at, at + n) of it at dst. Written as writeFileImage (buffered).
using FileFill = std::function<void(uint64_t at, uint64_t n, char* dst)>;
WrittenFile writeFileFrom(const std::string& path, uint64_t size, const FileFill& fill,
                          const security::Key* key = nullptr);

struct TensorFile {
  nlohmann::json meta;
  StateDict tensors;  // in file order
};

// Reads a tensor file. Throws DataError naming the path and what is wrong
// (bad magic, truncated, a tensor outside the file). A sealed file is opened
// with the installed keyring (security::installedKeyring()); one that fails
// authentication is a DataError naming it.
TensorFile readTensorFile(const std::string& path);

// The header only: meta and each tensor's name, dtype and shape.
struct TensorInfo;
// The tensors `wanted` accepts (all, when empty), read one at a time and
// handed to `visit`, which may drop each: the file is never held whole
// (but for a sealed one, decrypted in memory). Throws as readTensorFile.
void visitTensorFile(const std::string& path, const std::function<bool(const TensorInfo&)>& wanted,
                     const std::function<void(const std::string&, at::Tensor)>& visit);
struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};
std::vector<TensorInfo> readTensorFileInfo(const std::string& path, nlohmann::json* meta = nullptr);

// A tensor file opened once, its tensors read by name when asked (a
// checkpoint read one unit at a time: ckpt::StageTensors). The header is
// checked on opening; a sealed file is decrypted in memory then. Throws as
// readTensorFile.
class TensorFileReader {
 public:
  explicit TensorFileReader(const std::string& path);
  ~TensorFileReader();
  TensorFileReader(TensorFileReader&&) noexcept;
  TensorFileReader& operator=(TensorFileReader&&) noexcept;
  const std::string& path() const;
  const nlohmann::json& meta() const;
  const std::vector<TensorInfo>& tensors() const;  // in file order
  bool has(const std::string& name) const;
  // Tensor `name`, read now; DataError naming the file and tensor when the
  // file has none of that name.
  at::Tensor read(const std::string& name) const;
  at::Tensor read(size_t index) const;
  // Indices [begin, end) of tensor `name` along dimension `dim`: only
  // their bytes are read (a region of a tensor, ckpt::CheckpointTensors),
  // in one read along the first dimension, one per leading index along
  // another.
  at::Tensor readRange(const std::string& name, int64_t dim, int64_t begin, int64_t end) const;
  // Bytes read by read() and readRows() so far.
  uint64_t bytesRead() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// "float32", "int64", ... and back; throws DataError for an unknown name.
std::string dtypeName(c10::ScalarType t);
c10::ScalarType dtypeFromName(const std::string& name);

}  // namespace cohort::ckpt
