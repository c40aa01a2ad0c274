#pragma once

// State dicts in PyTorch's own file format, both ways: cohort writes what
// torch.load() reads, and reads what torch.save(model.state_dict()) writes.

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "cohort/security/keys.h"

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

// Reads a state dict saved by torch.save (zip format; an OrderedDict or dict
// of tensors, or a checkpoint dict holding one under "state_dict" or
// "model") or by saveStateDict (sealed ones with the installed keyring,
// security::installedKeyring()). Only tensors, containers and plain values
// are accepted: any other Python object is refused. Throws DataError naming
// the file and what is wrong.
StateDict readStateDict(const std::string& path);

// Copies `dict` into the module's parameters and buffers, strictly: throws
// DataError naming the first missing, unexpected or shape-mismatching
// tensor, with `origin` (the file) in the message.
void loadStateDict(torch::nn::Module& module, const StateDict& dict, const std::string& origin);

// The same into `targets`, tensors of a module (a part of its state dict).
void loadStateDict(const StateDict& targets, const StateDict& dict, const std::string& origin);

}  // namespace cohort::ckpt
