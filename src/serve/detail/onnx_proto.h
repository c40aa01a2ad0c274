#pragma once

// The few ONNX messages `cohort export --format onnx` writes, and their
// encoding in protobuf's wire format (onnx.proto, IR version 8).
//
// Why a writer of our own: an export needs a dozen message types and only
// to write them. Debian ships no onnx.proto for libprotobuf to compile, and
// the wire format of these messages is small and stable (tags, varints,
// length-delimited fields), so these plain structs and ~150 lines encode
// them without a code generator or a runtime dependency. Nothing here
// includes LibTorch: tensors arrive as raw little-endian bytes, or as a
// size and a function that gives them when the file is written, so that
// the trained tensors are read one at a time and never held together.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cohort::serve::detail::onnx {

// TensorProto.DataType values used here.
enum class DataType : int32_t { kFloat = 1, kInt64 = 7, kBool = 9 };

// A constant (an initializer or an attribute's value): dims and raw_data.
struct Tensor {
  std::string name;
  DataType type = DataType::kFloat;
  std::vector<int64_t> dims;
  std::string raw;  // little-endian values, row-major
  // Or, when `fill` is set, `size` bytes that fill(at, n, dst) puts at dst
  // (bytes [at, at + n), asked for in order) while the file is written.
  using Fill = std::function<void(uint64_t at, uint64_t n, char* dst)>;
  uint64_t size = 0;
  Fill fill;

  static Tensor floats(std::string name, std::vector<int64_t> dims, const std::vector<float>& values);
  static Tensor int64s(std::string name, std::vector<int64_t> dims, const std::vector<int64_t>& values);
};

// AttributeProto, of the kinds the graph builders need.
struct Attribute {
  enum class Kind : int32_t { kFloat = 1, kInt = 2, kString = 3, kTensor = 4, kInts = 7 };
  std::string name;
  Kind kind = Kind::kInt;
  float f = 0;
  int64_t i = 0;
  std::string s;
  std::vector<int64_t> ints;
  Tensor t;

  static Attribute ofFloat(std::string name, float value);
  static Attribute ofInt(std::string name, int64_t value);
  static Attribute ofInts(std::string name, std::vector<int64_t> values);
};

struct Node {
  std::string opType;
  std::string name;
  std::vector<std::string> inputs;  // "" for a left-out optional input
  std::vector<std::string> outputs;
  std::vector<Attribute> attributes;
};

// One axis of a graph input or output: a fixed size or a named free one.
struct Dim {
  int64_t value = 0;  // used when `param` is empty
  std::string param;  // dim_param: "batch", "time"
};

struct ValueInfo {
  std::string name;
  DataType type = DataType::kFloat;
  std::vector<Dim> shape;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;  // in topological order
  std::vector<Tensor> initializers;
  std::vector<ValueInfo> inputs, outputs;
};

struct Model {
  int64_t irVersion = 8;  // onnx 1.12 (opset 17)
  int64_t opset = 17;     // of the default domain ai.onnx
  std::string producerName = "cohort";
  std::string producerVersion;
  std::string docString;
  Graph graph;
  std::vector<std::pair<std::string, std::string>> metadata;  // metadata_props
};

// The ModelProto's bytes.
std::string serialize(const Model& model);

// The same without an image of it in memory: its size, and bytes
// [at, at + n) copied out on demand (asked in order), the initializers'
// asked of their `fill` then (a file writer streams it: writeOnnx).
class Encoded {
 public:
  explicit Encoded(const Model& model);
  ~Encoded();
  uint64_t size() const;
  void copy(uint64_t at, uint64_t n, char* dst) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace cohort::serve::detail::onnx
