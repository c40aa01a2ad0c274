#include "ckpt/detail/pickle.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "cohort/core/error.h"

namespace cohort::ckpt::detail {
namespace {

using Kind = Value::Kind;

ValuePtr make(Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

const std::map<std::string, at::ScalarType>& storageTypes() {
  static const std::map<std::string, at::ScalarType> m = {
      {"torch.FloatStorage", at::kFloat},   {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},     {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},     {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},   {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},     {"torch.BoolStorage", at::kBool},
  };
  return m;
}

bool allowedGlobal(const std::string& name) {
  return name == "collections.OrderedDict" || name == "torch._utils._rebuild_tensor_v2" ||
         name == "torch._utils._rebuild_parameter" || name == "torch.jit._pickle.restore_type_tag" ||
         name == "builtins.dict" || name == "__builtin__.dict" || storageTypes().count(name) > 0;
}

class Unpickler {
 public:
  Unpickler(const std::string& data, const StorageLoader& load, const std::string& origin)
      : data_(data), load_(load), origin_(origin) {}
  ~Unpickler() {
    std::vector<ValuePtr> all = std::move(stack_);
    // A container appended to itself (through the memo) keeps its nodes alive
    // past any dismantling: empty every container that was added to and is
    // not part of the result first. Only such a container can close a cycle.
    for (const auto& w : mutated_) {
      const ValuePtr v = w.lock();
      if (!v || result_.count(v.get()) > 0) continue;
      for (auto& item : v->items) all.push_back(std::move(item));
      for (auto& [k, x] : v->entries) {
        all.push_back(std::move(k));
        all.push_back(std::move(x));
      }
      v->items.clear();
      v->entries.clear();
    }
    for (auto& [key, v] : memo_) all.push_back(std::move(v));
    dismantle(std::move(all));
  }

  ValuePtr run() {
    for (;;) {
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;          // PROTO
        case 0x95: bytes(8); break;        // FRAME
        case '.': {                        // STOP
          auto root = pop();
          checkAcyclic(root);
          return root;
        }
        case '(': marks_.push_back(stack_.size()); break;
        case '}': stack_.push_back(make(Kind::dict)); break;
        case ']': stack_.push_back(make(Kind::list)); break;
        case ')': stack_.push_back(make(Kind::tuple)); break;
        case 'd': {                        // DICT
          auto items = popMark();
          auto d = make(Kind::dict);
          addPairs(*d, items);
          stack_.push_back(d);
          break;
        }
        case 'l': stack_.push_back(container(Kind::list, popMark())); break;   // LIST
        case 't': stack_.push_back(container(Kind::tuple, popMark())); break;  // TUPLE
        case 0x85: case 0x86: case 0x87: { // TUPLE1..3
          const size_t n = op - 0x84;
          need(n);
          std::vector<ValuePtr> items(stack_.end() - static_cast<long>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          stack_.push_back(container(Kind::tuple, std::move(items)));
          break;
        }
        case 's': {                        // SETITEM
          auto v = pop();
          auto k = pop();
          auto d = top(Kind::dict, "SETITEM");
          d->entries.emplace_back(k, v);
          mutated_.push_back(d);
          break;
        }
        case 'u': {                        // SETITEMS
          auto items = popMark();
          auto d = top(Kind::dict, "SETITEMS");
          addPairs(*d, items);
          mutated_.push_back(d);
          break;
        }
        case 'a': {                        // APPEND
          auto v = pop();
          auto l = top(Kind::list, "APPEND");
          l->items.push_back(v);
          mutated_.push_back(l);
          break;
        }
        case 'e': {                        // APPENDS
          auto items = popMark();
          auto l = top(Kind::list, "APPENDS");
          l->items.insert(l->items.end(), items.begin(), items.end());
          mutated_.push_back(l);
          break;
        }
        case 'q': memo_[byte()] = peek(); break;          // BINPUT
        case 'r': memo_[uint32()] = peek(); break;        // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = peek(); break;   // MEMOIZE
        case 'h': stack_.push_back(memoGet(byte())); break;    // BINGET
        case 'j': stack_.push_back(memoGet(uint32())); break;  // LONG_BINGET
        case 'K': pushInt(byte()); break;                       // BININT1
        case 'M': pushInt(uint16()); break;                     // BININT2
        case 'J': pushInt(static_cast<int32_t>(uint32())); break;  // BININT
        case 0x8a: {                       // LONG1
          const size_t n = byte();
          if (n > 8) fail("integer wider than 64 bits");
          const std::string b = bytes(n);
          uint64_t u = 0;
          for (size_t k = 0; k < n; ++k) u |= uint64_t(uint8_t(b[k])) << (8 * k);
          if (n > 0 && n < 8 && (uint8_t(b[n - 1]) & 0x80)) u |= ~uint64_t(0) << (8 * n);
          pushInt(static_cast<int64_t>(u));
          break;
        }
        case 'G': {                        // BINFLOAT (big-endian double)
          const std::string b = bytes(8);
          uint64_t u = 0;
          for (int k = 0; k < 8; ++k) u = (u << 8) | uint8_t(b[k]);
          auto v = make(Kind::floating);
          std::memcpy(&v->f, &u, 8);
          stack_.push_back(v);
          break;
        }
        case 0x88: case 0x89: {            // NEWTRUE, NEWFALSE
          auto v = make(Kind::boolean);
          v->b = op == 0x88;
          stack_.push_back(v);
          break;
        }
        case 'N': stack_.push_back(make(Kind::none)); break;
        case 'X': pushString(Kind::string, uint32()); break;     // BINUNICODE
        case 0x8c: pushString(Kind::string, byte()); break;      // SHORT_BINUNICODE
        case 0x8d: pushString(Kind::string, uint64()); break;    // BINUNICODE8
        case 'T': pushString(Kind::string, uint32()); break;     // BINSTRING
        case 'U': pushString(Kind::string, byte()); break;       // SHORT_BINSTRING
        case 'B': pushString(Kind::bytes, uint32()); break;      // BINBYTES
        case 'C': pushString(Kind::bytes, byte()); break;        // SHORT_BINBYTES
        case 0x8e: pushString(Kind::bytes, uint64()); break;     // BINBYTES8
        case 'c': {                        // GLOBAL "module\nname\n"
          std::string module = line();
          std::string name = line();
          pushGlobal(module + "." + name);
          break;
        }
        case 0x93: {                       // STACK_GLOBAL
          auto name = pop();
          auto module = pop();
          if (module->kind != Kind::string || name->kind != Kind::string) fail("bad STACK_GLOBAL");
          pushGlobal(module->s + "." + name->s);
          break;
        }
        case 'Q': {                        // BINPERSID
          auto pid = pop();
          stack_.push_back(persistent(*pid));
          break;
        }
        case 'R': {                        // REDUCE
          auto args = pop();
          auto fn = pop();
          stack_.push_back(reduce(*fn, *args));
          break;
        }
        case 0x81: {                       // NEWOBJ
          auto args = pop();
          auto cls = pop();
          stack_.push_back(reduce(*cls, *args));
          break;
        }
        case 'b': {                        // BUILD: state on a dict or tensor (metadata) is ignored
          pop();
          auto obj = peek();
          if (obj->kind != Kind::dict && obj->kind != Kind::tensor) {
            fail("BUILD on an object that is not a dict or tensor");
          }
          break;
        }
        default:
          fail(fmt::format("unsupported pickle opcode 0x{:02x} at byte {}", op, pos_ - 1));
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(fmt::format("{}: cannot read state dict: {}", origin_, what));
  }

  uint8_t byte() {
    if (pos_ >= data_.size()) fail("unexpected end of pickle data");
    return static_cast<uint8_t>(data_[pos_++]);
  }
  std::string bytes(size_t n) {
    if (n > data_.size() - pos_) fail("unexpected end of pickle data");
    std::string out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint16_t uint16() {
    const std::string b = bytes(2);
    return static_cast<uint16_t>(uint8_t(b[0]) | (uint8_t(b[1]) << 8));
  }
  uint32_t uint32() {
    const std::string b = bytes(4);
    return uint32_t(uint8_t(b[0])) | (uint32_t(uint8_t(b[1])) << 8) |
           (uint32_t(uint8_t(b[2])) << 16) | (uint32_t(uint8_t(b[3])) << 24);
  }
  uint64_t uint64() {
    const std::string b = bytes(8);
    uint64_t u = 0;
    for (int k = 7; k >= 0; --k) u = (u << 8) | uint8_t(b[k]);
    return u;
  }
  std::string line() {
    const size_t end = data_.find('\n', pos_);
    if (end == std::string::npos) fail("unterminated GLOBAL");
    std::string s = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  void need(size_t n) const {
    const size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() < floor + n) fail("stack underflow");
  }
  ValuePtr pop() {
    need(1);
    auto v = stack_.back();
    stack_.pop_back();
    return v;
  }
  ValuePtr peek() const {
    if (stack_.empty()) fail("stack underflow");
    return stack_.back();
  }
  ValuePtr top(Kind k, const char* op) const {
    auto v = peek();
    if (v->kind != k) fail(fmt::format("{} on the wrong kind of object", op));
    return v;
  }
  std::vector<ValuePtr> popMark() {
    if (marks_.empty()) fail("missing MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) fail("bad MARK");
    std::vector<ValuePtr> items(stack_.begin() + static_cast<long>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  void addPairs(Value& d, const std::vector<ValuePtr>& items) const {
    if (items.size() % 2 != 0) fail("odd number of dict items");
    for (size_t k = 0; k < items.size(); k += 2) d.entries.emplace_back(items[k], items[k + 1]);
  }
  static ValuePtr container(Kind k, std::vector<ValuePtr> items) {
    auto v = make(k);
    v->items = std::move(items);
    return v;
  }
  ValuePtr memoGet(uint64_t key) const {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail(fmt::format("memo key {} not defined", key));
    return it->second;
  }
  void pushInt(int64_t x) {
    auto v = make(Kind::integer);
    v->i = x;
    stack_.push_back(v);
  }
  void pushString(Kind k, uint64_t n) {
    auto v = make(k);
    v->s = bytes(static_cast<size_t>(n));
    stack_.push_back(v);
  }
  void pushGlobal(const std::string& name) {
    if (!allowedGlobal(name)) {
      fail(fmt::format("refusing Python object '{}': only tensors, containers and plain values "
                       "are read",
                       name));
    }
    auto v = make(Kind::global);
    v->s = name;
    stack_.push_back(v);
  }

  const Value& arg(const Value& args, size_t i, Kind k, const char* what) const {
    if (args.kind != Kind::tuple || i >= args.items.size() || args.items[i]->kind != k) {
      fail(fmt::format("bad argument {} ({}) of a tensor", i, what));
    }
    return *args.items[i];
  }
  std::vector<int64_t> ints(const Value& t, const char* what) const {
    if (t.kind != Kind::tuple) fail(fmt::format("{} is not a tuple", what));
    std::vector<int64_t> out;
    for (const auto& x : t.items) {
      if (x->kind != Kind::integer) fail(fmt::format("{} holds a non-integer", what));
      out.push_back(x->i);
    }
    return out;
  }

  ValuePtr persistent(const Value& pid) {
    // ('storage', <storage type>, key, location, numel)
    if (pid.kind != Kind::tuple || pid.items.size() < 5 || pid.items[0]->kind != Kind::string ||
        pid.items[0]->s != "storage" || pid.items[1]->kind != Kind::global ||
        pid.items[2]->kind != Kind::string || pid.items[4]->kind != Kind::integer) {
      fail("unsupported persistent id (expected a tensor storage)");
    }
    auto type = storageTypes().find(pid.items[1]->s);
    if (type == storageTypes().end()) fail(fmt::format("unknown storage type {}", pid.items[1]->s));
    const std::string& key = pid.items[2]->s;
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;
    auto v = make(Kind::storage);
    v->tensor = load_(key, type->second, pid.items[4]->i);
    storages_[key] = v;
    return v;
  }

  ValuePtr reduce(const Value& fn, const Value& args) {
    if (fn.kind != Kind::global) fail("REDUCE of something that is not an allowed function");
    if (args.kind != Kind::tuple) fail("REDUCE arguments are not a tuple");
    const std::string& name = fn.s;
    if (name == "collections.OrderedDict" || name == "builtins.dict" || name == "__builtin__.dict") {
      auto d = make(Kind::dict);
      if (!args.items.empty()) {
        // OrderedDict([(k, v), ...])
        const auto& l = *args.items[0];
        for (const auto& kv : l.items) {
          if (kv->kind != Kind::tuple || kv->items.size() != 2) fail("bad OrderedDict item");
          d->entries.emplace_back(kv->items[0], kv->items[1]);
        }
      }
      return d;
    }
    if (name == "torch._utils._rebuild_tensor_v2") {
      const Value& storage = arg(args, 0, Kind::storage, "storage");
      const int64_t offset = arg(args, 1, Kind::integer, "offset").i;
      const auto size = ints(arg(args, 2, Kind::tuple, "size"), "size");
      const auto stride = ints(arg(args, 3, Kind::tuple, "stride"), "stride");
      if (size.size() != stride.size()) fail("size and stride of a tensor differ in length");
      // The last element reached must lie inside the storage; checked
      // arithmetic, as every number here comes from the file.
      if (offset < 0) fail("negative storage offset");
      int64_t last = offset;
      bool empty = false;
      for (size_t k = 0; k < size.size(); ++k) {
        if (size[k] < 0 || stride[k] < 0) fail("negative size or stride");
        empty = empty || size[k] == 0;
        int64_t reach = 0;
        if (size[k] > 0 && (__builtin_mul_overflow(size[k] - 1, stride[k], &reach) ||
                            __builtin_add_overflow(last, reach, &last))) {
          fail("tensor size overflows");
        }
      }
      if (!empty && last >= storage.tensor.numel()) {
        fail("tensor reaches past the end of its storage");
      }
      auto v = make(Kind::tensor);
      v->tensor = storage.tensor.as_strided(size, stride, offset);
      return v;
    }
    if (name == "torch._utils._rebuild_parameter") {
      auto v = make(Kind::tensor);
      v->tensor = arg(args, 0, Kind::tensor, "data").tensor;
      return v;
    }
    if (name == "torch.jit._pickle.restore_type_tag") {
      if (args.items.empty()) fail("restore_type_tag without a value");
      return args.items[0];
    }
    fail(fmt::format("cannot call '{}'", name));
  }

  // The result is a tree whose subtrees may be shared; a cycle (which no
  // state dict holds) is refused. Records the result's nodes in result_.
  void checkAcyclic(const ValuePtr& root) {
    std::unordered_map<const Value*, bool> done;  // node -> left the path
    std::vector<std::pair<const Value*, size_t>> path{{root.get(), 0}};
    done[root.get()] = false;
    while (!path.empty()) {
      const Value* v = path.back().first;
      const size_t i = path.back().second++;
      const size_t n = v->items.size() + 2 * v->entries.size();
      if (i == n) {
        done[v] = true;
        path.pop_back();
        continue;
      }
      const size_t e = i - v->items.size();
      const Value* child = i < v->items.size() ? v->items[i].get()
                           : e % 2 == 0      ? v->entries[e / 2].first.get()
                                             : v->entries[e / 2].second.get();
      auto [it, fresh] = done.emplace(child, false);
      if (fresh) {
        path.emplace_back(child, 0);
      } else if (!it->second) {
        fail("a container holds itself (a cycle), which no state dict does");
      }
    }
    for (const auto& [node, left] : done) result_.insert(node);
  }

  const std::string& data_;
  const StorageLoader& load_;
  const std::string& origin_;
  size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;
  std::vector<std::weak_ptr<Value>> mutated_;  // containers added to after they were made
  std::unordered_set<const Value*> result_;   // nodes of the returned value
};

}  // namespace

void dismantle(std::vector<ValuePtr> roots) {
  // Each node hands its children to the work list before it is released, so
  // no destructor ever recurses. A node someone else still holds is only
  // let go of: its last holder takes it apart.
  while (!roots.empty()) {
    ValuePtr v = std::move(roots.back());
    roots.pop_back();
    if (!v || v.use_count() > 1) continue;
    for (auto& item : v->items) roots.push_back(std::move(item));
    for (auto& [k, x] : v->entries) {
      roots.push_back(std::move(k));
      roots.push_back(std::move(x));
    }
    v->items.clear();
    v->entries.clear();
  }
}

void dismantle(ValuePtr&& root) {
  std::vector<ValuePtr> roots;  // not {root}: an initializer_list would copy
  roots.push_back(std::move(root));
  dismantle(std::move(roots));
}

ValuePtr unpickle(const std::string& data, const StorageLoader& loadStorage,
                  const std::string& origin) {
  return Unpickler(data, loadStorage, origin).run();
}

}  // namespace cohort::ckpt::detail
