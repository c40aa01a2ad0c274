#include "models/torchscript.h"

#include <fmt/format.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "cohort/core/error.h"

namespace cohort::models {
namespace {

// The module's tensors, registered under the same names in `into`.
void mirror(torch::nn::Module& into, const torch::jit::Module& from) {
  for (const auto& p : from.named_parameters(/*recurse=*/false)) {
    into.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const auto& b : from.named_buffers(/*recurse=*/false)) into.register_buffer(b.name, b.value);
  for (const auto& c : from.named_children()) {
    auto child = std::make_shared<torch::nn::Module>(c.name);
    mirror(*child, c.value);
    into.register_module(c.name, child);
  }
}

class ScriptedModel : public Model {
 public:
  ScriptedModel(torch::jit::Module script, std::string path)
      : script_(std::move(script)), path_(std::move(path)) {
    mirror(*this, script_);
  }

  at::Tensor forward(const at::Tensor& input) override {
    c10::IValue out = script_.forward({inLayout(input)});
    if (!out.isTensor()) {
      throw DataError(fmt::format("{}: forward returned a {}, not a Tensor of logits", path_,
                                  out.tagKind()));
    }
    return out.toTensor();
  }

  void train(bool on) override {
    Model::train(on);
    script_.train(on);
  }

 private:
  torch::jit::Module script_;
  std::string path_;
};

// forward(self, x: Tensor) -> Tensor, further arguments only with defaults.
void checkForward(const torch::jit::Module& module, const std::string& path) {
  const auto method = module.find_method("forward");
  if (!method) {
    throw ConfigError(fmt::format("model.path: {}: the module has no forward method", path));
  }
  const c10::FunctionSchema& schema = method->function().getSchema();
  const auto& args = schema.arguments();
  size_t required = 0;
  for (size_t i = 1; i < args.size(); ++i) required += args[i].default_value() ? 0 : 1;
  const bool tensorIn = args.size() >= 2 && args[1].type()->kind() == c10::TypeKind::TensorType;
  const bool tensorOut =
      schema.returns().size() == 1 && schema.returns()[0].type()->kind() == c10::TypeKind::TensorType;
  if (required != 1 || !tensorIn || !tensorOut) {
    std::ostringstream text;
    text << schema;
    throw ConfigError(fmt::format(
        "model.path: {}: forward must take the batch's input Tensor and return a Tensor of logits "
        "(forward(self, x: Tensor) -> Tensor), but it is {}",
        path, text.str()));
  }
}

}  // namespace

std::shared_ptr<Model> loadScriptedModel(const std::string& path) {
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw DataError(fmt::format("model.path: {}: not a TorchScript module (save one with "
                                "torch.jit.save(torch.jit.script(model), path)): {}",
                                path, what.substr(0, what.find('\n'))));
  }
  checkForward(module, path);
  auto model = std::make_shared<ScriptedModel>(std::move(module), path);
  if (model->parameters().empty()) {
    throw ConfigError(fmt::format("model.path: {}: the module has no parameters to train", path));
  }
  return model;
}

}  // namespace cohort::models
