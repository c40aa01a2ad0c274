#include "cohort/ckpt/state_dict.h"

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <c10/util/strides.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ckpt/detail/pickle.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/security/sealed.h"

namespace cohort::ckpt {
namespace {

void collect(const torch::nn::Module& m, const std::string& prefix, StateDict& out) {
  for (const auto& p : m.named_parameters(/*recurse=*/false)) {
    if (p.value().defined()) out.emplace_back(prefix + p.key(), p.value());
  }
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    if (b.value().defined()) out.emplace_back(prefix + b.key(), b.value());
  }
  for (const auto& c : m.named_children()) collect(*c.value(), prefix + c.key() + ".", out);
}

bool isTensorDict(const detail::Value& v) {
  if (v.kind != detail::Value::Kind::dict) return false;
  for (const auto& [k, x] : v.entries) {
    if (k->kind != detail::Value::Kind::string || x->kind != detail::Value::Kind::tensor) {
      return false;
    }
  }
  return true;
}

std::string shapeText(at::IntArrayRef s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

}  // namespace

StateDict stateDict(const torch::nn::Module& module) {
  StateDict out;
  collect(module, "", out);
  return out;
}

void saveStateDict(const StateDict& dict, const std::string& path, const security::Key* key) {
  c10::Dict<std::string, at::Tensor> d;
  for (const auto& [name, t] : dict) d.insert(name, t.detach().cpu().contiguous());
  std::vector<char> bytes = torch::pickle_save(d);
  if (key != nullptr) {
    writeFileAtomic(path, security::sealBytes(*key, security::sealedLabel(path), bytes.data(), bytes.size()));
  } else {
    writeFileAtomic(path, bytes.data(), bytes.size());
  }
}

namespace {

// A torch.save archive opened for reading: its data.pkl, and its records
// read on demand.
struct Archive {
  std::string path;
  std::unique_ptr<std::istringstream> plain;  // an encrypted file, opened in memory
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  std::string pickled;
};

std::unique_ptr<Archive> openArchive(const std::string& path) {
  auto a = std::make_unique<Archive>();
  a->path = path;
  // An encrypted file is opened in memory with the installed keyring.
  if (security::isSealedFile(path)) {
    a->plain = std::make_unique<std::istringstream>(security::readSealedFile(path, security::installedKeyring()));
  }
  {
    std::ifstream file;
    if (!a->plain) {
      file.open(path, std::ios::binary);
      if (!file) throw DataError(fmt::format("{}: cannot open", path));
    }
    std::istream& in = a->plain ? static_cast<std::istream&>(*a->plain) : file;
    char magic[2] = {0, 0};
    in.read(magic, 2);
    if (a->plain) a->plain->seekg(0);
    if (in.gcount() != 2 || magic[0] != 'P' || magic[1] != 'K') {
      throw DataError(fmt::format(
          "{}: not a zip-format PyTorch file (save it with torch.save in PyTorch >= 1.6 and "
          "without _use_new_zipfile_serialization=False)",
          path));
    }
  }
  try {
    a->reader = a->plain ? std::make_unique<caffe2::serialize::PyTorchStreamReader>(a->plain.get())
                         : std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    if (!a->reader->hasRecord("data.pkl")) {
      throw DataError(fmt::format("{}: no data.pkl in the archive: not a torch.save file", path));
    }
    auto [ptr, size] = a->reader->getRecord("data.pkl");
    a->pickled.assign(static_cast<const char*>(ptr.get()), size);
  } catch (const c10::Error& e) {
    throw DataError(fmt::format("{}: corrupt PyTorch archive: {}", path, e.what_without_backtrace()));
  }
  return a;
}

// Storage `key` of the archive: numel elements of dtype, read now.
at::Tensor readStorage(Archive& a, const std::string& key, at::ScalarType dtype, int64_t numel) {
  const std::string& path = a.path;
  const std::string record = "data/" + key;
  if (!a.reader->hasRecord(record)) {
    throw DataError(fmt::format("{}: storage {} missing from the archive", path, record));
  }
  try {
    auto [ptr, size] = a.reader->getRecord(record);
    const size_t element = c10::elementSize(dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > size / element) {
      throw DataError(fmt::format("{}: storage {} claims {} elements but holds {} bytes", path,
                                  record, numel, size));
    }
    const size_t expected = static_cast<size_t>(numel) * element;
    if (size != expected) {
      throw DataError(fmt::format("{}: storage {} holds {} bytes, expected {}", path, record,
                                  size, expected));
    }
    at::Tensor t = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
    if (size > 0) std::memcpy(t.data_ptr(), ptr.get(), size);
    return t;
  } catch (const c10::Error& e) {
    throw DataError(fmt::format("{}: cannot read {}: {}", path, record, e.what_without_backtrace()));
  }
}

// Unpickles the archive's dict of tensors (loading each storage with
// `load`) and returns it.
StateDict unpickleTensors(const Archive& a, const detail::StorageLoader& load) {
  const std::string& path = a.path;
  detail::ValuePtr root;
  try {
    root = detail::unpickle(a.pickled, load, path);
  } catch (const c10::Error& e) {
    throw DataError(fmt::format("{}: malformed state dict: {}", path, e.what_without_backtrace()));
  }
  const detail::Value* dict = root.get();
  // Frees the value tree without recursion, also when we throw below.
  struct Dismantle {
    detail::ValuePtr& root;
    ~Dismantle() { detail::dismantle(std::move(root)); }
  } dismantleOnExit{root};
  if (!isTensorDict(*dict)) {
    dict = nullptr;
    if (root->kind == detail::Value::Kind::dict) {
      for (const auto& [k, v] : root->entries) {
        if (k->kind == detail::Value::Kind::string && (k->s == "state_dict" || k->s == "model") &&
            isTensorDict(*v)) {
          dict = v.get();
          break;
        }
      }
    }
    if (dict == nullptr) {
      throw DataError(fmt::format(
          "{}: not a state dict: expected a dict of tensor names to tensors (or a dict holding "
          "one under 'state_dict' or 'model')",
          path));
    }
  }
  StateDict out;
  for (const auto& [k, v] : dict->entries) out.emplace_back(k->s, v->tensor);
  return out;
}

}  // namespace

StateDict readStateDict(const std::string& path) {
  const std::unique_ptr<Archive> a = openArchive(path);
  return unpickleTensors(*a, [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    return readStorage(*a, key, dtype, numel);
  });
}

at::Tensor withoutData(c10::IntArrayRef shape, at::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(nullptr, c10::Device(c10::kCPU)),
                       /*allocator=*/nullptr, /*resizable=*/false);
  return torch::empty({0}, torch::TensorOptions().dtype(dtype)).set_(storage, 0, shape, c10::contiguous_strides(shape));
}

struct LazyStateDict::State {
  std::unique_ptr<Archive> archive;
  StateDict entries;
  struct Source {
    std::string key;
    at::ScalarType dtype;
    int64_t numel;
  };
  std::map<const c10::StorageImpl*, Source> sources;
};

LazyStateDict::LazyStateDict(const std::string& path) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.archive = openArchive(path);
  // Each storage is made with its size and no data: views of it can be
  // cut (their bounds are checked) and its data read on demand.
  s.entries = unpickleTensors(*s.archive, [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    if (numel < 0) throw DataError(fmt::format("{}: storage {} claims {} elements", path, key, numel));
    at::Tensor t = withoutData({numel}, dtype);
    s.sources.emplace(t.storage().unsafeGetStorageImpl(), State::Source{key, dtype, numel});
    return t;
  });
}

LazyStateDict::~LazyStateDict() = default;

const StateDict& LazyStateDict::entries() const { return state_->entries; }

at::Tensor LazyStateDict::load(const std::string& name) {
  State& s = *state_;
  for (const auto& [n, t] : s.entries) {
    if (n != name) continue;
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    if (impl->data_ptr().get() == nullptr && impl->nbytes() > 0) {
      const State::Source& src = s.sources.at(impl);
      at::Tensor data;
      try {
        data = readStorage(*s.archive, src.key, src.dtype, src.numel);
      } catch (const DataError& e) {
        throw DataError(fmt::format("{} (tensor '{}')", e.what(), name));
      }
      impl->set_data_ptr_noswap(std::move(data.storage().unsafeGetStorageImpl()->data_ptr()));
    }
    return t;
  }
  throw DataError(fmt::format("{}: no tensor '{}'", s.archive->path, name));
}

void LazyStateDict::drop(const std::string& name) {
  for (const auto& [n, t] : state_->entries) {
    if (n == name) t.storage().unsafeGetStorageImpl()->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  }
}

void loadStateDict(torch::nn::Module& module, const StateDict& dict, const std::string& origin) {
  loadStateDict(stateDict(module), dict, origin);
}

namespace {

// Throws DataError unless `dict` has exactly the names of `targets`, each
// of its shape.
void checkStateDict(const StateDict& targets, const StateDict& dict, const std::string& origin) {
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : dict) given[name] = &t;
  std::set<std::string> known;
  for (const auto& [name, t] : targets) {
    known.insert(name);
    auto it = given.find(name);
    if (it == given.end()) {
      throw DataError(fmt::format("{}: missing tensor '{}' (shape {}) that the model needs",
                                  origin, name, shapeText(t.sizes())));
    }
    if (it->second->sizes() != t.sizes()) {
      throw DataError(fmt::format("{}: tensor '{}' has shape {}, the model expects {}", origin,
                                  name, shapeText(it->second->sizes()), shapeText(t.sizes())));
    }
  }
  for (const auto& [name, t] : dict) {
    if (known.count(name) == 0) {
      throw DataError(fmt::format("{}: unexpected tensor '{}' (shape {}): the model has no such "
                                  "parameter or buffer",
                                  origin, name, shapeText(t.sizes())));
    }
  }
}

}  // namespace

void loadStateDict(const StateDict& targets, const StateDict& dict, const std::string& origin) {
  checkStateDict(targets, dict, origin);
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : dict) given[name] = &t;
  torch::NoGradGuard g;
  StateDict own = targets;
  for (auto& [name, t] : own) t.copy_(*given[name]);
}

void loadStateDict(const StateDict& targets, TensorSource& source, const StateDict& entries,
                   const std::string& origin) {
  checkStateDict(targets, entries, origin);
  std::map<std::string, at::Tensor> into(targets.begin(), targets.end());
  torch::NoGradGuard g;
  // In the source's order: a checkpoint puts one bucket together at a time.
  for (const auto& [name, t] : entries) {
    into.at(name).copy_(source.load(name));
    source.drop(name);
  }
}

}  // namespace cohort::ckpt
