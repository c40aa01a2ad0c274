// ckpt::StateDictWriter: torch.save's zip archive written tensor by tensor.
//
// The archive (as torch.save writes it): data/<key> holds each storage's
// bytes, data.pkl a pickle (protocol 2) of a dict name -> tensor, each
// tensor torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
// requires_grad, backward_hooks) with the storage a persistent id
// ("storage", torch.<Type>Storage, key, "cpu", numel), and version.

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstring>
#include <functional>
#include <map>

#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/security/sealed.h"

namespace cohort::ckpt {

namespace {

// Python's name for the storage class of a dtype.
const char* storageClass(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "FloatStorage";
    case at::kDouble: return "DoubleStorage";
    case at::kHalf: return "HalfStorage";
    case at::kBFloat16: return "BFloat16Storage";
    case at::kLong: return "LongStorage";
    case at::kInt: return "IntStorage";
    case at::kShort: return "ShortStorage";
    case at::kChar: return "CharStorage";
    case at::kByte: return "ByteStorage";
    case at::kBool: return "BoolStorage";
    default:
      throw Error(fmt::format("a state dict cannot hold tensors of {}", c10::toString(t)));
  }
}

// Pickle protocol 2 opcodes for a dict of tensors.
class Pickle {
 public:
  Pickle() { out_ += "\x80\x02"; }
  void mark() { out_ += '('; }
  void tuple() { out_ += 't'; }
  void emptyTuple() { out_ += ')'; }
  void reduce() { out_ += 'R'; }
  void setItems() { out_ += 'u'; }
  void emptyDict() { out_ += '}'; }
  void persistentId() { out_ += 'Q'; }
  void boolean(bool v) { out_ += v ? '\x88' : '\x89'; }
  void stop() { out_ += '.'; }
  void none() { out_ += 'N'; }
  void emptyList() { out_ += ']'; }
  void appends() { out_ += 'e'; }
  void real(double v) {  // BINFLOAT: 8 bytes, big-endian
    out_ += 'G';
    uint64_t bits = 0;
    std::memcpy(&bits, &v, 8);
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
  }
  void global(const std::string& module, const std::string& name) { out_ += "c" + module + "\n" + name + "\n"; }
  void string(const std::string& s) {
    out_ += 'X';
    const uint32_t n = static_cast<uint32_t>(s.size());
    out_.append(reinterpret_cast<const char*>(&n), 4);  // little-endian (x86, arm64)
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      const int32_t x = static_cast<int32_t>(v);
      out_.append(reinterpret_cast<const char*>(&x), 4);
    } else {
      out_ += '\x8a';  // LONG1: n bytes, little-endian two's complement
      out_ += static_cast<char>(8);
      out_.append(reinterpret_cast<const char*>(&v), 8);
    }
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

struct Entry {
  std::string key;  // its storage's record
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
  int64_t numel = 0;
};

// torch._utils._rebuild_tensor_v2 of entry e's storage, contiguous.
void rebuild(Pickle& p, const Entry& e) {
  p.global("torch._utils", "_rebuild_tensor_v2");
  p.mark();
  p.mark();
  p.string("storage");
  p.global("torch", storageClass(e.dtype));
  p.string(e.key);
  p.string("cpu");
  p.integer(e.numel);
  p.tuple();
  p.persistentId();
  p.integer(0);
  p.mark();
  for (int64_t v : e.sizes) p.integer(v);
  p.tuple();
  p.mark();
  int64_t stride = 1;
  std::vector<int64_t> strides(e.sizes.size());
  for (size_t d = e.sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(e.sizes[d], 1);
  }
  for (int64_t v : strides) p.integer(v);
  p.tuple();
  p.boolean(false);
  p.global("collections", "OrderedDict");
  p.emptyTuple();
  p.reduce();
  p.tuple();
  p.reduce();
}

}  // namespace

struct StateDictWriter::State {
  std::string path;
  std::unique_ptr<AtomicFile> file;  // null when sealed
  const security::Key* key = nullptr;
  std::string memory;  // the archive, when sealed
  std::string error;   // of the last write into the file
  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> zip;
  std::map<std::string, Entry> entries;
  std::map<const c10::TensorImpl*, std::string> standIns;  // add()'s results: their names
  std::vector<std::string> order;
  int64_t nextKey = 0;
};

StateDictWriter::StateDictWriter(std::string path, const security::Key* key)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.path = std::move(path);
  s.key = key;
  if (key == nullptr) s.file = std::make_unique<AtomicFile>(s.path);
  State* st = &s;
  s.zip = std::make_unique<caffe2::serialize::PyTorchStreamWriter>([st](const void* data, size_t n) -> size_t {
    if (!st->file) {
      st->memory.append(static_cast<const char*>(data), n);
      return n;
    }
    // After a failed write the rest is only counted: the zip writer would
    // throw on a short write, and its destructor writes again (a throw
    // there ends the process). add() and close() throw the error instead.
    if (!st->error.empty()) return n;
    try {
      st->file->write(data, n);
    } catch (const std::exception& e) {
      st->error = e.what();
    }
    return n;
  });
}

StateDictWriter::~StateDictWriter() {
  // Its destructor may still write: into the temporary file, which goes next.
  state_->zip.reset();
}

at::Tensor StateDictWriter::add(const std::string& name, const at::Tensor& t) {
  State& s = *state_;
  if (s.entries.count(name) != 0) throw Error(fmt::format("{}: '{}' added twice", s.path, name));
  const at::Tensor c = t.detach().to(torch::kCPU).contiguous();
  Entry e{std::to_string(s.nextKey++), c.scalar_type(), c.sizes().vec(), c.numel()};
  storageClass(e.dtype);  // refuses a dtype the format has no storage for
  try {
    s.zip->writeRecord("data/" + e.key, c.data_ptr(), c.nbytes());
  } catch (const c10::Error& err) {
    throw IoError(s.error.empty() ? fmt::format("cannot write {}: {}", s.path, err.what_without_backtrace())
                                  : s.error);
  }
  if (!s.error.empty()) throw IoError(s.error);
  at::Tensor standIn = withoutData(e.sizes, e.dtype);
  s.standIns.emplace(standIn.unsafeGetTensorImpl(), name);
  s.entries.emplace(name, std::move(e));
  s.order.push_back(name);
  return standIn;
}

void StateDictWriter::alias(const std::string& name, const std::string& of) {
  State& s = *state_;
  auto it = s.entries.find(of);
  if (it == s.entries.end()) throw Error(fmt::format("{}: '{}' is an alias of '{}', never added", s.path, name, of));
  s.entries.emplace(name, it->second);
  s.order.push_back(name);
}

void StateDictWriter::finish(const std::vector<std::string>& order) {
  State& s = *state_;
  const std::vector<std::string>& names = order.empty() ? s.order : order;
  if (names.size() != s.order.size()) {
    throw Error(fmt::format("{}: {} names in the order given, {} tensors added", s.path, names.size(), s.order.size()));
  }
  Pickle p;
  p.emptyDict();
  p.mark();
  for (const std::string& name : names) {
    auto it = s.entries.find(name);
    if (it == s.entries.end()) throw Error(fmt::format("{}: '{}' was never added", s.path, name));
    p.string(name);
    rebuild(p, it->second);
  }
  p.setItems();
  p.stop();
  close(p.bytes());
}

void StateDictWriter::finishValue(const c10::IValue& root) {
  State& s = *state_;
  Pickle p;
  std::function<void(const c10::IValue&)> put = [&](const c10::IValue& v) {
    if (v.isNone()) {
      p.none();
    } else if (v.isBool()) {
      p.boolean(v.toBool());
    } else if (v.isInt()) {
      p.integer(v.toInt());
    } else if (v.isDouble()) {
      p.real(v.toDouble());
    } else if (v.isString()) {
      p.string(v.toStringRef());
    } else if (v.isTuple()) {
      const auto& items = v.toTupleRef().elements();
      if (items.empty()) return p.emptyTuple();
      p.mark();
      for (const auto& i : items) put(i);
      p.tuple();
    } else if (v.isList()) {
      p.emptyList();
      if (v.toListRef().empty()) return;
      p.mark();
      for (const auto& i : v.toListRef()) put(i);
      p.appends();
    } else if (v.isGenericDict()) {
      p.emptyDict();
      if (v.toGenericDict().empty()) return;
      p.mark();
      for (const auto& e : v.toGenericDict()) {
        put(e.key());
        put(e.value());
      }
      p.setItems();
    } else if (v.isTensor()) {
      auto it = s.standIns.find(v.toTensor().unsafeGetTensorImpl());
      if (it == s.standIns.end()) throw Error(fmt::format("{}: a tensor that add() did not return", s.path));
      rebuild(p, s.entries.at(it->second));
    } else {
      throw Error(fmt::format("{}: a value of type {} cannot be written", s.path, v.tagKind()));
    }
  };
  put(root);
  p.stop();
  close(p.bytes());
}

void StateDictWriter::close(const std::string& pickle) {
  State& s = *state_;
  try {
    s.zip->writeRecord("data.pkl", pickle.data(), pickle.size());
    s.zip->writeEndOfFile();
  } catch (const c10::Error& err) {
    throw IoError(s.error.empty() ? fmt::format("cannot write {}: {}", s.path, err.what_without_backtrace())
                                  : s.error);
  }
  s.zip.reset();
  if (!s.error.empty()) throw IoError(s.error);
  if (!s.file) {
    writeFileAtomic(s.path, security::sealBytes(*s.key, security::sealedLabel(s.path), s.memory.data(), s.memory.size()));
    return;
  }
  s.file->commit();
}

}  // namespace cohort::ckpt
