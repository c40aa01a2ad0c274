#include "cohort/models/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "cohort/models/llama.h"
#include "cohort/models/bert.h"
#include "models/resnet.h"
#include "models/simple_cnn.h"
#include "models/torchscript.h"

namespace cohort::models {

namespace {

// `t` (4-D) with the strides of `format`. Tensor::contiguous(format) keeps a
// tensor whose size-1 dimensions make it count as already contiguous, e.g. a
// one-channel image batch; kernels choose their layout from the strides.
at::Tensor restrided(const at::Tensor& t, at::MemoryFormat format) {
  at::Tensor out = at::empty(t.sizes(), t.options().memory_format(format));
  if (out.strides() == t.strides()) return t;
  out.copy_(t);
  return out;
}

}  // namespace

at::Tensor Model::decode(const std::vector<at::Tensor>&, const std::vector<KvCache*>&) {
  throw Error("this model keeps no key/value cache (only gpt and llama decode position by position)");
}

at::Tensor Model::decodePart(const at::Tensor&, const std::vector<at::Tensor>&, const std::vector<KvCache*>&) {
  throw Error("this model keeps no key/value cache (only gpt and llama decode position by position)");
}

at::Tensor Model::compute(const at::Tensor& input) {
  if (runner_ == nullptr) return forward(input);
  return runner_->run(UnitRunner::kWholeModel, [this](const at::Tensor& x) { return forward(x); },
                      input);
}

void Model::setChannelsLast(bool on) {
  torch::NoGradGuard noGrad;
  const auto format = on ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  for (auto& t : parameters()) {
    if (t.dim() == 4) t.set_data(restrided(t, format));
  }
  for (auto& t : buffers()) {
    if (t.dim() == 4) t.set_data(restrided(t, format));
  }
  channelsLast_ = on;
}

at::Tensor Model::inLayout(const at::Tensor& images) const {
  if (!channelsLast_ || images.dim() != 4) return images;
  return restrided(images, at::MemoryFormat::ChannelsLast);
}

namespace {

std::shared_ptr<Model> build(const ModelConfig& config, const InputShape& input, const ModelPart& part) {
  if (!part.whole() && pipelineBlocks(config) == 0) {
    throw ConfigError(fmt::format("model.arch: {} cannot be built in parts (a pipeline stage)",
                                  choiceName(config.arch)));
  }
  switch (config.arch) {
    case ModelArch::simpleCnn: return std::make_shared<SimpleCnn>(config, input);
    case ModelArch::resnet18: return std::make_shared<ResNet>(18, config, input, part);
    case ModelArch::resnet34: return std::make_shared<ResNet>(34, config, input, part);
    case ModelArch::resnet50: return std::make_shared<ResNet>(50, config, input, part);
    case ModelArch::resnet101: return std::make_shared<ResNet>(101, config, input, part);
    case ModelArch::gpt: return createGpt(gptOptions(config, config.vocabSize), part);
    case ModelArch::llama: return createLlama(llamaOptions(config, config.vocabSize), part);
    case ModelArch::bert: return createBert(bertOptions(config, config.vocabSize, config.padToken));
    case ModelArch::torchscript: return loadScriptedModel(config.path);
  }
  throw ConfigError(fmt::format("model.arch: unknown architecture ({})", static_cast<int>(config.arch)));
}

}  // namespace

std::vector<std::pair<std::string, std::string>> tiedNamesOf(const ModelConfig& config) {
  if (config.arch == ModelArch::gpt) return {{kTiedHeadName, "transformer.wte.weight"}};
  if (config.arch == ModelArch::llama && config.tieEmbeddings) return {{kLlamaHeadName, kLlamaEmbeddingName}};
  if (config.arch == ModelArch::bert && config.task == BertTask::maskedLm) {
    return {{kBertDecoderName, kBertEmbeddingName}, {kBertDecoderBiasName, kBertBiasName}};
  }
  return {};
}

std::vector<std::string> tiedAcrossStages(const ModelConfig& config) {
  std::vector<std::string> out;
  for (const auto& [second, name] : tiedNamesOf(config)) out.push_back(name);
  return out;
}

std::shared_ptr<Model> createModel(const ModelConfig& config, const InputShape& input,
                                   const ModelPart& part) {
  if (input.channels < 1 && !decoderArch(config.arch) && config.arch != ModelArch::bert &&
      config.arch != ModelArch::torchscript) {
    throw ConfigError(fmt::format("model.in_channels: must be >= 1, got {}", input.channels));
  }
  std::shared_ptr<Model> model = build(config, input, part);
  // Measured on CPU (docs/benchmarks.md): NHWC makes the small network's
  // max-pool and BatchNorm several times faster, and the ResNets slower.
  const bool channelsLast =
      config.memoryFormat == MemoryLayout::channelsLast ||
      (config.memoryFormat == MemoryLayout::automatic && config.arch == ModelArch::simpleCnn);
  if (channelsLast) model->setChannelsLast(true);
  return model;
}

void releaseStorage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void allocateStorage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

bool hasStorage(const at::Tensor& t) { return t.storage().nbytes() > 0 || t.numel() == 0; }

ckpt::StateDict publishedStateDict(const Model& model) {
  ckpt::StateDict dict = ckpt::stateDict(model);
  for (const auto& [alias, name] : model.tiedNames()) {
    for (size_t k = 0; k < dict.size(); ++k) {
      if (dict[k].first == name) {
        dict.emplace_back(alias, dict[k].second);
        break;
      }
    }
  }
  return dict;
}

ckpt::StateDict withoutTiedNames(const Model& model, ckpt::StateDict dict) {
  for (const auto& tied : model.tiedNames()) {
    const std::string& alias = tied.first;
    dict.erase(std::remove_if(dict.begin(), dict.end(), [&](const auto& e) { return e.first == alias; }),
               dict.end());
  }
  return dict;
}

namespace {

// The model's tensors `given` (names) lacks that Model::optionalWeights()
// lets it lack: they keep their values.
std::set<std::string> keptAsBuilt(const Model& model, const ckpt::StateDict& given) {
  std::set<std::string> out;
  const std::vector<std::string> optional = model.optionalWeights();
  if (optional.empty()) return out;
  std::set<std::string> names;
  for (const auto& [name, t] : given) names.insert(name);
  for (const auto& entry : ckpt::stateDict(model)) {
    const std::string& name = entry.first;
    const bool isOptional = std::any_of(optional.begin(), optional.end(),
                                        [&](const std::string& p) { return name.rfind(p, 0) == 0; });
    if (isOptional && names.count(name) == 0) out.insert(name);
  }
  return out;
}

}  // namespace

void loadWeights(Model& model, ckpt::StateDict dict, const std::string& origin) {
  dict = withoutTiedNames(model, std::move(dict));
  const std::set<std::string> kept = keptAsBuilt(model, dict);
  for (const auto& [name, t] : ckpt::stateDict(model)) {
    if (kept.count(name) != 0) dict.emplace_back(name, t.detach().clone());
  }
  ckpt::loadStateDict(model, std::move(dict), origin);
}

void loadWeights(Model& model, ckpt::TensorSource& source, const std::string& origin, bool part) {
  const ckpt::StateDict entries =
      withoutTiedNames(model, part ? partOfStateDict(model, source.entries()) : source.entries());
  ckpt::StateDict into = ckpt::stateDict(model);
  const std::set<std::string> kept = keptAsBuilt(model, entries);
  into.erase(std::remove_if(into.begin(), into.end(), [&](const auto& e) { return kept.count(e.first) != 0; }),
             into.end());
  ckpt::loadStateDict(into, source, entries, origin);
}

ckpt::StateDict partOfStateDict(const Model& part, ckpt::StateDict dict) {
  std::set<std::string> held;
  for (const auto& [name, t] : ckpt::stateDict(part)) held.insert(name);
  for (const auto& [alias, name] : part.tiedNames()) held.insert(alias);
  dict.erase(std::remove_if(dict.begin(), dict.end(), [&](const auto& e) { return held.count(e.first) == 0; }),
             dict.end());
  return dict;
}

int64_t parameterCount(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace cohort::models
