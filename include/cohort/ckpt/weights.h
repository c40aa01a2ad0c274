#pragma once

// Trained weights in either file format cohort writes (output.weights_format:
// PyTorch's zip, state_dict.h, or safetensors, safetensors.h), read and
// written through one interface, so that model.init_from, the final model,
// `cohort export` and `cohort ckpt consolidate` take both.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/config/choices.h"
#include "cohort/security/keys.h"

namespace cohort::ckpt {

// Where a model's weights go, tensor by tensor, whatever the file format:
// add() each tensor (its bytes leave the caller's memory when it returns),
// alias() a tied second name, finish() to put the file in place atomically.
// Destroyed without finish(), nothing is at the path.
class WeightsWriter {
 public:
  virtual ~WeightsWriter() = default;
  virtual void add(const std::string& name, const at::Tensor& t) = 0;
  virtual void alias(const std::string& name, const std::string& of) = 0;
  // `order`: the names in the file's order (empty: the order of the adds).
  virtual void finish(const std::vector<std::string>& order = {}) = 0;
};

// ".pt" or ".safetensors".
const char* weightsExtension(WeightsFormat format);

// The weights in the file at `path`, whichever format its first bytes say
// (a sealed file with the installed keyring). Throws DataError naming the
// file and what is wrong.
std::unique_ptr<TensorSource> openWeights(const std::string& path);

// A writer of `format` at `path`, sealed with `key` when given (pt only:
// ConfigError for safetensors with a key). Throws IoError naming the path.
std::unique_ptr<WeightsWriter> openWeightsWriter(const std::string& path, WeightsFormat format,
                                                 const security::Key* key = nullptr);

// `dict` at `path` in `format`, atomically (tensors sharing their data with
// one before them written as aliases).
void saveWeights(const StateDict& dict, const std::string& path, WeightsFormat format,
                 const security::Key* key = nullptr);

}  // namespace cohort::ckpt
