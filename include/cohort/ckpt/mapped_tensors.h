#pragma once

// Tensors spilled to a file and mapped back. A TorchScript module is
// serialized from memory with every tensor of the model registered on it at
// once; to export a model that no process holds (docs/zero.md), each tensor
// is read from a TensorSource, written to an unnamed temporary file and
// dropped, one at a time, and the module is given views of the file's map.
// Those pages are the file's: the kernel takes them back under a memory
// limit, and release() gives a range back as soon as it has been written out.

#include <torch/types.h>

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"

namespace cohort::ckpt {

class MappedTensors {
 public:
  // The tensors `names` of `source`, each passed through `convert` (to the
  // dtype and device written out; the result is stored contiguous), in a
  // file in `dir` that has no name (it goes with this object, or with the
  // process). Throws IoError naming `dir`, and what source.load() throws.
  MappedTensors(TensorSource& source, const std::vector<std::string>& names, const std::string& dir,
                const std::function<at::Tensor(const at::Tensor&)>& convert);
  ~MappedTensors();
  MappedTensors(const MappedTensors&) = delete;
  MappedTensors& operator=(const MappedTensors&) = delete;

  // Views of the map (CPU; written to, a page becomes this process's own).
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }
  // Gives back the whole pages of [data, data + size) that lie in the map
  // (read again from the file if touched later); other ranges are ignored.
  void release(const void* data, size_t size) const;
  size_t bytes() const { return size_; }

 private:
  std::map<std::string, at::Tensor> tensors_;
  char* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace cohort::ckpt
