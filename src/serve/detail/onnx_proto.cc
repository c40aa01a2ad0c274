#include "serve/detail/onnx_proto.h"

#include <algorithm>
#include <cstring>

namespace cohort::serve::detail::onnx {

namespace {

// Protobuf's wire format: each field is a key (field number << 3 | wire
// type) and a value; varints for integers and enums, 32 bits for float,
// length-prefixed bytes for strings and embedded messages. Repeated scalar
// fields are written one key per value (unpacked), which every parser reads.
// An encoding is a list of pieces: bytes, or a tensor's bytes to be asked
// of its fill when written (only their size is needed before).
class Encoder {
 public:
  void varint(uint64_t v) {
    std::string& out = text();
    while (v >= 0x80) {
      out.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out.push_back(static_cast<char>(v));
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
    text().append(s);
  }
  void fixed32(int field, float f) {
    key(field, 5);
    char b[4];
    std::memcpy(b, &f, 4);  // little-endian hosts only (x86-64, aarch64)
    text().append(b, 4);
  }
  // An embedded message.
  void message(int field, Encoder&& inner) {
    key(field, 2);
    varint(inner.size());
    for (auto& p : inner.pieces_) {
      if (p.fill) {
        pieces_.push_back(std::move(p));
      } else {
        text().append(p.text);
      }
    }
  }
  // `size` bytes given by `fill` when written.
  void deferred(int field, uint64_t size, const Tensor::Fill& fill) {
    key(field, 2);
    varint(size);
    pieces_.push_back({{}, size, fill});
  }
  uint64_t size() const {
    uint64_t n = 0;
    for (const auto& p : pieces_) n += p.fill ? p.size : p.text.size();
    return n;
  }
  // Bytes [at, at + n) of the encoding at dst.
  void copy(uint64_t at, uint64_t n, char* dst) const {
    uint64_t start = 0;
    for (const auto& p : pieces_) {
      const uint64_t len = p.fill ? p.size : p.text.size();
      if (n > 0 && at < start + len) {
        const uint64_t from = at - start, k = std::min(n, len - from);
        if (p.fill) {
          p.fill(from, k, dst);
        } else {
          std::memcpy(dst, p.text.data() + from, k);
        }
        dst += k;
        at += k;
        n -= k;
      }
      start += len;
    }
  }

 private:
  struct Piece {
    std::string text;
    uint64_t size = 0;
    Tensor::Fill fill;
  };
  std::string& text() {
    if (pieces_.empty() || pieces_.back().fill) pieces_.emplace_back();
    return pieces_.back().text;
  }
  std::vector<Piece> pieces_;
};

Encoder encode(const Tensor& t) {
  Encoder e;
  for (int64_t d : t.dims) e.integer(1, d);    // dims
  e.integer(2, static_cast<int64_t>(t.type));  // data_type
  if (!t.name.empty()) e.bytes(8, t.name);     // name
  if (t.fill) {
    e.deferred(9, t.size, t.fill);  // raw_data
  } else {
    e.bytes(9, t.raw);
  }
  return e;
}

Encoder encode(const Attribute& a) {
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
      e.message(5, encode(a.t));
      break;
    case Attribute::Kind::kInts:
      for (int64_t v : a.ints) e.integer(8, v);
      break;
  }
  e.integer(20, static_cast<int64_t>(a.kind));  // type
  return e;
}

Encoder encode(const Node& n) {
  Encoder e;
  for (const auto& in : n.inputs) e.bytes(1, in);
  for (const auto& out : n.outputs) e.bytes(2, out);
  if (!n.name.empty()) e.bytes(3, n.name);
  e.bytes(4, n.opType);
  for (const auto& a : n.attributes) e.message(5, encode(a));
  return e;
}

Encoder encode(const ValueInfo& v) {
  Encoder shape;
  for (const Dim& d : v.shape) {
    Encoder dim;
    if (d.param.empty()) {
      dim.integer(1, d.value);  // dim_value
    } else {
      dim.bytes(2, d.param);  // dim_param
    }
    shape.message(1, std::move(dim));
  }
  Encoder tensorType;  // TypeProto.Tensor
  tensorType.integer(1, static_cast<int64_t>(v.type));
  tensorType.message(2, std::move(shape));
  Encoder type;  // TypeProto
  type.message(1, std::move(tensorType));
  Encoder e;
  e.bytes(1, v.name);
  e.message(2, std::move(type));
  return e;
}

Encoder encode(const Graph& g) {
  Encoder e;
  for (const auto& n : g.nodes) e.message(1, encode(n));
  e.bytes(2, g.name);
  for (const auto& t : g.initializers) e.message(5, encode(t));
  for (const auto& v : g.inputs) e.message(11, encode(v));
  for (const auto& v : g.outputs) e.message(12, encode(v));
  return e;
}

Encoder encode(const Model& m) {
  Encoder e;
  e.integer(1, m.irVersion);  // ir_version
  e.bytes(2, m.producerName);
  if (!m.producerVersion.empty()) e.bytes(3, m.producerVersion);
  if (!m.docString.empty()) e.bytes(6, m.docString);
  e.message(7, encode(m.graph));
  Encoder opset;  // OperatorSetIdProto: the default domain ("") and its version
  opset.bytes(1, "");
  opset.integer(2, m.opset);
  e.message(8, std::move(opset));
  for (const auto& [key, value] : m.metadata) {
    Encoder entry;  // StringStringEntryProto
    entry.bytes(1, key);
    entry.bytes(2, value);
    e.message(14, std::move(entry));
  }
  return e;
}

template <class T>
std::string rawOf(const std::vector<T>& values) {
  std::string raw(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(raw.data(), values.data(), raw.size());
  return raw;
}

}  // namespace

Tensor Tensor::floats(std::string name, std::vector<int64_t> dims, const std::vector<float>& values) {
  Tensor t;
  t.name = std::move(name);
  t.type = DataType::kFloat;
  t.dims = std::move(dims);
  t.raw = rawOf(values);
  return t;
}

Tensor Tensor::int64s(std::string name, std::vector<int64_t> dims, const std::vector<int64_t>& values) {
  Tensor t = floats(std::move(name), std::move(dims), {});
  t.type = DataType::kInt64;
  t.raw = rawOf(values);
  return t;
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
  const Encoder e = encode(m);
  std::string out(e.size(), '\0');
  e.copy(0, out.size(), out.data());
  return out;
}

struct Encoded::State {
  Encoder e;
};

Encoded::Encoded(const Model& model) : state_(std::make_unique<State>(State{encode(model)})) {}
Encoded::~Encoded() = default;
uint64_t Encoded::size() const { return state_->e.size(); }
void Encoded::copy(uint64_t at, uint64_t n, char* dst) const { state_->e.copy(at, n, dst); }

}  // namespace cohort::serve::detail::onnx
