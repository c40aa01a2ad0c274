#include "serve/detail/onnx_proto.h"

#include <cstring>

namespace cohort::serve::detail::onnx {

namespace {

// Protobuf's wire format: each field is a key (field number << 3 | wire
// type) and a value; varints for integers and enums, 32 bits for float,
// length-prefixed bytes for strings and embedded messages. Repeated scalar
// fields are written one key per value (unpacked), which every parser reads.
class Encoder {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void key(int field, int wireType) {
    varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wireType));
  }
  // int64/int32/enum: negative values as their 64-bit two's complement.
  void integer(int field, int64_t v) {
    key(field, 0);
    varint(static_cast<uint64_t>(v));
  }
  void bytes(int field, const std::string& s) {
    key(field, 2);
    varint(s.size());
    out_.append(s);
  }
  void fixed32(int field, float f) {
    key(field, 5);
    char b[4];
    std::memcpy(b, &f, 4);  // little-endian hosts only (x86-64, aarch64)
    out_.append(b, 4);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string encode(const Tensor& t) {
  Encoder e;
  for (int64_t d : t.dims) e.integer(1, d);    // dims
  e.integer(2, static_cast<int64_t>(t.type));  // data_type
  if (!t.name.empty()) e.bytes(8, t.name);     // name
  e.bytes(9, t.raw);                           // raw_data
  return e.take();
}

std::string encode(const Attribute& a) {
  Encoder e;
  e.bytes(1, a.name);
  switch (a.kind) {
    case Attribute::Kind::kFloat:
      e.fixed32(2, a.f);
      break;
    case Attribute::Kind::kInt:
      e.integer(3, a.i);
      break;
    case Attribute::Kind::kString:
      e.bytes(4, a.s);
      break;
    case Attribute::Kind::kTensor:
      e.bytes(5, encode(a.t));
      break;
    case Attribute::Kind::kInts:
      for (int64_t v : a.ints) e.integer(8, v);
      break;
  }
  e.integer(20, static_cast<int64_t>(a.kind));  // type
  return e.take();
}

std::string encode(const Node& n) {
  Encoder e;
  for (const auto& in : n.inputs) e.bytes(1, in);
  for (const auto& out : n.outputs) e.bytes(2, out);
  if (!n.name.empty()) e.bytes(3, n.name);
  e.bytes(4, n.opType);
  for (const auto& a : n.attributes) e.bytes(5, encode(a));
  return e.take();
}

std::string encode(const ValueInfo& v) {
  Encoder shape;
  for (const Dim& d : v.shape) {
    Encoder dim;
    if (d.param.empty()) {
      dim.integer(1, d.value);  // dim_value
    } else {
      dim.bytes(2, d.param);  // dim_param
    }
    shape.bytes(1, dim.take());
  }
  Encoder tensorType;  // TypeProto.Tensor
  tensorType.integer(1, static_cast<int64_t>(v.type));
  tensorType.bytes(2, shape.take());
  Encoder type;  // TypeProto
  type.bytes(1, tensorType.take());
  Encoder e;
  e.bytes(1, v.name);
  e.bytes(2, type.take());
  return e.take();
}

std::string encode(const Graph& g) {
  Encoder e;
  for (const auto& n : g.nodes) e.bytes(1, encode(n));
  e.bytes(2, g.name);
  for (const auto& t : g.initializers) e.bytes(5, encode(t));
  for (const auto& v : g.inputs) e.bytes(11, encode(v));
  for (const auto& v : g.outputs) e.bytes(12, encode(v));
  return e.take();
}

template <class T>
std::string rawOf(const std::vector<T>& values) {
  std::string raw(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(raw.data(), values.data(), raw.size());
  return raw;
}

}  // namespace

Tensor Tensor::floats(std::string name, std::vector<int64_t> dims, const std::vector<float>& values) {
  return Tensor{std::move(name), DataType::kFloat, std::move(dims), rawOf(values)};
}

Tensor Tensor::int64s(std::string name, std::vector<int64_t> dims, const std::vector<int64_t>& values) {
  return Tensor{std::move(name), DataType::kInt64, std::move(dims), rawOf(values)};
}

Attribute Attribute::ofFloat(std::string name, float value) {
  Attribute a;
  a.name = std::move(name);
  a.kind = Kind::kFloat;
  a.f = value;
  return a;
}

Attribute Attribute::ofInt(std::string name, int64_t value) {
  Attribute a;
  a.name = std::move(name);
  a.kind = Kind::kInt;
  a.i = value;
  return a;
}

Attribute Attribute::ofInts(std::string name, std::vector<int64_t> values) {
  Attribute a;
  a.name = std::move(name);
  a.kind = Kind::kInts;
  a.ints = std::move(values);
  return a;
}

std::string serialize(const Model& m) {
  Encoder e;
  e.integer(1, m.irVersion);  // ir_version
  e.bytes(2, m.producerName);
  if (!m.producerVersion.empty()) e.bytes(3, m.producerVersion);
  if (!m.docString.empty()) e.bytes(6, m.docString);
  e.bytes(7, encode(m.graph));
  Encoder opset;  // OperatorSetIdProto: the default domain ("") and its version
  opset.bytes(1, "");
  opset.integer(2, m.opset);
  e.bytes(8, opset.take());
  for (const auto& [key, value] : m.metadata) {
    Encoder entry;  // StringStringEntryProto
    entry.bytes(1, key);
    entry.bytes(2, value);
    e.bytes(14, entry.take());
  }
  return e.take();
}

}  // namespace cohort::serve::detail::onnx
