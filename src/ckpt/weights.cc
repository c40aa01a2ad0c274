#include "cohort/ckpt/weights.h"

#include <fmt/format.h>

#include <map>
#include <optional>

#include "cohort/ckpt/safetensors.h"
#include "cohort/core/error.h"

namespace cohort::ckpt {
namespace {

// StateDictWriter behind the common interface.
class PtWriter final : public WeightsWriter {
 public:
  PtWriter(const std::string& path, const security::Key* key) : w_(path, key) {}
  void add(const std::string& name, const at::Tensor& t) override { (void)w_.add(name, t); }
  void alias(const std::string& name, const std::string& of) override { w_.alias(name, of); }
  void finish(const std::vector<std::string>& order) override { w_.finish(order); }

 private:
  StateDictWriter w_;
};

}  // namespace

const char* weightsExtension(WeightsFormat format) {
  return format == WeightsFormat::safetensors ? ".safetensors" : ".pt";
}

std::unique_ptr<TensorSource> openWeights(const std::string& path) {
  // By content, or by name: a damaged .safetensors file gets the reader
  // that says what is wrong with it.
  const std::string ext = ".safetensors";
  const bool named = path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  if (named || isSafetensors(path)) return std::make_unique<SafetensorsFile>(path);
  return std::make_unique<LazyStateDict>(path);
}

std::unique_ptr<WeightsWriter> openWeightsWriter(const std::string& path, WeightsFormat format,
                                                 const security::Key* key) {
  if (format == WeightsFormat::pt) return std::make_unique<PtWriter>(path, key);
  if (key != nullptr) {
    throw ConfigError(fmt::format("{}: safetensors files cannot be encrypted; write pt to seal it", path));
  }
  return std::make_unique<SafetensorsWriter>(path);
}

void saveWeights(const StateDict& dict, const std::string& path, WeightsFormat format, const security::Key* key) {
  if (format == WeightsFormat::pt) {
    saveStateDict(dict, path, key);
    return;
  }
  if (key != nullptr) {
    throw ConfigError(fmt::format("{}: safetensors files cannot be encrypted; write pt to seal it", path));
  }
  saveSafetensors(dict, path);
}

}  // namespace cohort::ckpt
