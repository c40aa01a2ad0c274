#pragma once

// A reader for the subset of Python's pickle protocol (0-5) that state dicts
// use: None, bools, ints, floats, strings, bytes, tuples, lists, dicts, a
// short list of allowed globals (OrderedDict, tensor rebuild functions,
// storage types) and persistent ids for tensor storages. Anything else is
// refused, so loading a file never runs or builds arbitrary objects.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cohort::ckpt::detail {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  enum class Kind { none, boolean, integer, floating, string, bytes, tuple, list, dict, global,
                    storage, tensor };
  Kind kind = Kind::none;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                   // string, bytes, global "module.name"
  std::vector<ValuePtr> items;                     // tuple, list
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;  // dict, in insertion order
  at::Tensor tensor;                               // storage (1-d, its dtype), tensor
};

// Releases the given references, freeing the nodes nobody else holds
// without recursion (a hostile file may nest millions of levels).
void dismantle(std::vector<ValuePtr> roots);
void dismantle(ValuePtr&& root);

// Returns the bytes of storage `key` ("data/<key>" in the archive) as a 1-d
// tensor of `dtype` holding `numel` elements.
using StorageLoader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype,
                                               int64_t numel)>;

// Unpickles `data`. Throws DataError("<origin>: ...") on anything outside the
// supported subset or on malformed input.
ValuePtr unpickle(const std::string& data, const StorageLoader& loadStorage,
                  const std::string& origin);

}  // namespace cohort::ckpt::detail
