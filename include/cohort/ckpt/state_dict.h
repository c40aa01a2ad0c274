#pragma once

// State dicts in PyTorch's own file format, both ways: cohort writes what
// torch.load() reads, and reads what torch.save(model.state_dict()) writes.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/security/keys.h"

namespace c10 {
struct IValue;
}

namespace torch::nn {
class Module;
}

namespace cohort::ckpt {

// Name -> tensor, in order.
using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

// The parameters and buffers of `module` named and ordered as PyTorch's
// Module.state_dict(): each module's own parameters, then its buffers, then
// its children, depth first. Tensors are shared with the module, not copied.
StateDict stateDict(const torch::nn::Module& module);

// Writes `dict` as a PyTorch zip archive holding a pickled dict of tensors
// (torch.load returns a dict), atomically. Throws IoError naming the path.
// With a `key` the archive is sealed (cohort/security/sealed.h), which
// PyTorch cannot load; readStateDict can, with the key installed.
void saveStateDict(const StateDict& dict, const std::string& path,
                   const security::Key* key = nullptr);

// A state dict written tensor by tensor, in the file format of
// saveStateDict: each tensor's bytes go to the file when it is added (the
// caller may free it then), the dict's names at finish(). For a model no
// process holds whole (ZeRO stage 3's final save). Atomic: nothing is at
// `path` until finish() returns. With a `key` the file is sealed, which
// needs the archive in memory: then it is held until finish().
class StateDictWriter {
 public:
  explicit StateDictWriter(std::string path, const security::Key* key = nullptr);
  ~StateDictWriter();  // without finish(): the temporary file goes
  StateDictWriter(const StateDictWriter&) = delete;
  StateDictWriter& operator=(const StateDictWriter&) = delete;
  // Writes `t` (on any device, any layout: saved contiguous) under `name`.
  // Returns a stand-in of its shape without data, for finishValue().
  at::Tensor add(const std::string& name, const at::Tensor& t);
  // `name` is a second name of `of`, added before (a tied tensor): one
  // storage, as torch.save writes shared tensors.
  void alias(const std::string& name, const std::string& of);
  // The dict, its names in `order` (each added before; empty: the order of
  // the adds), then the file in place. Throws IoError naming the path,
  // Error naming a name never added.
  void finish(const std::vector<std::string>& order = {});
  // Or any value instead of that dict: None, bools, ints, floats, strings,
  // tuples, lists and dicts of them, and add()'s stand-ins for the tensors
  // (torch.optim's state_dict(), written one parameter's state at a time).
  void finishValue(const c10::IValue& root);

 private:
  void close(const std::string& pickle);
  struct State;
  std::unique_ptr<State> state_;
};

// Reads a state dict saved by torch.save (zip format; an OrderedDict or dict
// of tensors, or a checkpoint dict holding one under "state_dict" or
// "model") or by saveStateDict (sealed ones with the installed keyring,
// security::installedKeyring()). Only tensors, containers and plain values
// are accepted: any other Python object is refused. Throws DataError naming
// the file and what is wrong.
StateDict readStateDict(const std::string& path);

// Tensors read one at a time: every tensor's name, dtype and shape first
// (entries(), without data), then each one's data when load()ed, given back
// by drop(), so that a model no process holds whole is read one unit at a
// time (ZeRO stage 3's model.init_from and resume, docs/zero.md).
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const StateDict& entries() const = 0;
  // The tensor `name` with its data read (DataError naming the file and
  // tensor when it is missing or truncated).
  virtual at::Tensor load(const std::string& name) = 0;
  virtual void drop(const std::string& name) = 0;
};

// A tensor of `shape` and `dtype` whose storage has its size and no data:
// an entry of a TensorSource (views of it can be cut, their bounds checked).
at::Tensor withoutData(c10::IntArrayRef shape, at::ScalarType dtype);

// readStateDict() as a TensorSource. Tensors sharing a storage share the
// reads. Throws as readStateDict.
class LazyStateDict : public TensorSource {
 public:
  explicit LazyStateDict(const std::string& path);
  ~LazyStateDict() override;
  LazyStateDict(const LazyStateDict&) = delete;
  LazyStateDict& operator=(const LazyStateDict&) = delete;
  const StateDict& entries() const override;
  at::Tensor load(const std::string& name) override;
  void drop(const std::string& name) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Copies `dict` into the module's parameters and buffers, strictly: throws
// DataError naming the first missing, unexpected or shape-mismatching
// tensor, with `origin` (the file) in the message.
void loadStateDict(torch::nn::Module& module, const StateDict& dict, const std::string& origin);

// The same into `targets`, tensors of a module (a part of its state dict).
void loadStateDict(const StateDict& targets, const StateDict& dict, const std::string& origin);

// The same from `source`, checked against `entries` (source.entries(), or
// those of them meant for `targets`) before anything is read; then each
// tensor is read, copied and dropped before the next: no second copy of
// what `targets` holds.
void loadStateDict(const StateDict& targets, TensorSource& source, const StateDict& entries,
                   const std::string& origin);

}  // namespace cohort::ckpt
