#include "cohort/models/model.h"

#include <fmt/format.h>

#include "cohort/core/error.h"
#include "models/resnet.h"
#include "models/simple_cnn.h"

namespace cohort::models {

std::shared_ptr<Model> createModel(const ModelConfig& config, const InputShape& input) {
  if (input.channels < 1) {
    throw ConfigError(fmt::format("model.in_channels: must be >= 1, got {}", input.channels));
  }
  const std::string& a = config.arch;
  if (a == "simple_cnn") return std::make_shared<SimpleCnn>(config, input);
  if (a == "resnet18") return std::make_shared<ResNet>(18, config, input);
  if (a == "resnet34") return std::make_shared<ResNet>(34, config, input);
  if (a == "resnet50") return std::make_shared<ResNet>(50, config, input);
  if (a == "resnet101") return std::make_shared<ResNet>(101, config, input);
  throw ConfigError(fmt::format("model.arch: unknown architecture '{}'", a));
}

int64_t parameterCount(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace cohort::models
