#pragma once

// Weights in the safetensors format, both ways: the file Hugging Face's
// libraries write and read (docs/checkpoint-format.md, "safetensors"):
//
//   u64 little-endian N   N bytes of JSON header   the tensors' bytes
//
// The header maps each tensor's name to {"dtype", "shape", "data_offsets":
// [begin, end]}, the offsets counted from the first byte after the header;
// "__metadata__" maps strings to strings. The tensors' bytes are row-major
// and little-endian, and cover the data region exactly: no gap, no overlap.
// The format has no shared tensors: a tied second name (lm_head.weight) is
// not written, as Hugging Face's own save leaves it out.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/weights.h"

namespace cohort::ckpt {

// The largest header cohort reads (the format's own limit): a larger length
// is refused before anything is allocated.
inline constexpr uint64_t kSafetensorsMaxHeader = uint64_t{100} << 20;

// One tensor of a header, its offsets counted from the data region's start.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in the header's order
  std::map<std::string, std::string> metadata;
};

// Parses and checks `json`, the header of a file whose data region holds
// `dataBytes`: each dtype one cohort handles (F64, F32, F16, BF16, I64, I32,
// I16, I8, U8, BOOL), each shape's bytes the tensor's offsets span, every
// byte of the data region in exactly one tensor. Throws DataError naming
// `origin` and the tensor.
SafetensorsHeader parseSafetensorsHeader(std::string_view json, uint64_t dataBytes, const std::string& origin);

// The format's name of `dtype` ("F32", "BF16", ...). Throws Error for one
// it has no name for here.
const char* safetensorsDtypeName(at::ScalarType dtype);

// Whether the file at `path` begins as a safetensors file does: a length
// that fits the file, then '{'. False for anything unreadable.
bool isSafetensors(const std::string& path);

// A safetensors file as a TensorSource: the header read and checked when
// opened, each tensor's bytes when load()ed. Throws DataError naming the
// file and what is wrong.
class SafetensorsFile : public TensorSource {
 public:
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile() override;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const StateDict& entries() const override;
  at::Tensor load(const std::string& name) override;
  void drop(const std::string& name) override;
  const std::map<std::string, std::string>& metadata() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The safetensors writer: the tensors' bytes go to a scratch file beside
// `path` as they are added, the header and then those bytes to `path` at
// finish(). alias() is recorded in the metadata ("tied": "name=of,...")
// and nothing else. Throws IoError naming the path.
class SafetensorsWriter : public WeightsWriter {
 public:
  explicit SafetensorsWriter(std::string path, std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter() override;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  void add(const std::string& name, const at::Tensor& t) override;
  void alias(const std::string& name, const std::string& of) override;
  void finish(const std::vector<std::string>& order = {}) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// `dict` as a safetensors file at `path`, atomically. Tensors sharing a
// storage with one written before them are left out (as aliases). Throws
// IoError naming the path.
void saveSafetensors(const StateDict& dict, const std::string& path,
                     const std::map<std::string, std::string>& metadata = {});

}  // namespace cohort::ckpt
