#pragma once

// model.arch: torchscript: a module the user wrote in Python and saved with
// torch.jit.save(torch.jit.script(model)), trained like a built-in model.
//
// Its parameters and buffers are registered under their own names (fc1.weight,
// features.0.running_mean, ...) in a mirror of the module's tree, sharing the
// tensors: the optimizer, the gradient exchange, checkpoints and
// model/final.pt see them as they see a built-in model's, and the scripted
// forward computes with them. train()/eval() reach the scripted module too.

#include <memory>
#include <string>

#include "cohort/models/model.h"

namespace cohort::models {

// Loads the module at `path` (on the CPU). Throws DataError naming the file
// when it is not a TorchScript module, and ConfigError when its forward does
// not take one Tensor and return one Tensor or it has no parameters.
std::shared_ptr<Model> loadScriptedModel(const std::string& path);

}  // namespace cohort::models
