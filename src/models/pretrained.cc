#include "cohort/models/pretrained.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cohort/ckpt/weights.h"
#include "cohort/core/error.h"
#include "cohort/models/bert.h"
#include "cohort/models/gpt.h"
#include "cohort/models/hf_bert.h"
#include "cohort/models/hf_gpt2.h"
#include "cohort/models/hf_llama.h"
#include "cohort/models/llama.h"
#include "models/hf_json.h"

namespace cohort::models {
namespace {

namespace fs = std::filesystem;

class ShardedSource final : public ckpt::TensorSource {
 public:
  explicit ShardedSource(const std::string& index) : index_(index) {
    const nlohmann::json j = readHfJson(index);
    const auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object() || map->empty()) {
      throw DataError(fmt::format("{}: weight_map: expected an object mapping each tensor to its shard", index));
    }
    // Shards in the order the index first names them; each tensor from its own.
    std::map<std::string, std::string> shardOf;
    std::vector<std::string> order;
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string() || file.get<std::string>().empty()) {
        throw DataError(fmt::format("{}: weight_map: '{}' maps to {}, not a file name", index, name, file.dump()));
      }
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos) {
        throw DataError(fmt::format("{}: weight_map: '{}' is in '{}'; shards lie beside the index", index, name, f));
      }
      shardOf.emplace(name, f);
      if (shards_.count(f) == 0) {
        const fs::path path = fs::path(index).parent_path() / f;
        std::error_code ec;
        if (!fs::is_regular_file(path, ec)) {
          throw DataError(fmt::format("{}: weight_map: '{}' is in shard '{}', which is missing: {}", index, name, f,
                                      path.string()));
        }
        shards_.emplace(f, ckpt::openWeights(path.string()));
        order.push_back(f);
      }
    }
    for (const std::string& f : order) {
      std::set<std::string> held;
      for (const auto& [name, t] : shards_.at(f)->entries()) {
        held.insert(name);
        auto it = shardOf.find(name);
        if (it == shardOf.end() || it->second != f) continue;  // another shard's, or not in the model
        entries_.emplace_back(name, t);
        from_.emplace(name, shards_.at(f).get());
      }
      for (const auto& [name, file] : shardOf) {
        if (file == f && held.count(name) == 0) {
          throw DataError(fmt::format("{}: weight_map: '{}' is in shard '{}', which does not hold it", index, name, f));
        }
      }
    }
  }

  const ckpt::StateDict& entries() const override { return entries_; }
  at::Tensor load(const std::string& name) override {
    auto it = from_.find(name);
    if (it == from_.end()) throw DataError(fmt::format("{}: no tensor '{}'", index_, name));
    return it->second->load(name);
  }
  void drop(const std::string& name) override {
    if (auto it = from_.find(name); it != from_.end()) it->second->drop(name);
  }

 private:
  std::string index_;
  std::map<std::string, std::unique_ptr<ckpt::TensorSource>> shards_;
  std::map<std::string, ckpt::TensorSource*> from_;
  ckpt::StateDict entries_;
};

// The weights of a Hugging Face directory: the first of model.safetensors,
// its sharded index, pytorch_model.bin and its index. Sets `file` to it.
std::unique_ptr<ckpt::TensorSource> openDirectoryWeights(const std::string& dir, std::string& file) {
  std::error_code ec;
  for (const char* name : {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                           "pytorch_model.bin.index.json"}) {
    const fs::path p = fs::path(dir) / name;
    if (!fs::is_regular_file(p, ec)) continue;
    file = p.string();
    const std::string n = name;
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0) return openShardedWeights(file);
    return ckpt::openWeights(file);
  }
  throw DataError(fmt::format("{}: none of model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
                              "pytorch_model.bin.index.json",
                              dir));
}

// A BERT config.json at `cfg` checked against the job.
void checkBert(const std::string& cfg, const ModelConfig& config) {
  checkHfBertConfig(bertOptionsOf(readHfJson(cfg), cfg), bertOptions(config, config.vocabSize), cfg);
}

// A Llama config.json at `cfg` checked against the job, and the weights'
// shapes against it.
void checkLlama(const std::string& cfg, const ModelConfig& config, const ckpt::TensorSource& weights,
                const std::string& file) {
  const LlamaOptions theirs = llamaOptionsOf(readHfJson(cfg), cfg);
  checkHfLlamaConfig(theirs, llamaOptions(config, config.vocabSize), cfg);
  checkHfLlamaShapes(theirs, weights.entries(), cfg, file);
}

}  // namespace

std::unique_ptr<ckpt::TensorSource> openShardedWeights(const std::string& index) {
  return std::make_unique<ShardedSource>(index);
}

std::unique_ptr<ckpt::TensorSource> openPretrained(const std::string& path, const ModelConfig& config) {
  std::error_code ec;
  const bool gpt = config.arch == ModelArch::gpt, llama = config.arch == ModelArch::llama,
             bert = config.arch == ModelArch::bert;
  const GptOptions o = gptOptions(config, config.vocabSize);
  if (fs::is_directory(path, ec)) {
    if (!gpt && !llama && !bert) {
      throw DataError(fmt::format("{}: a directory; weights come in a file (.pt, .safetensors), or for model.arch "
                                  "gpt, llama and bert in a Hugging Face directory",
                                  path));
    }
    const std::string cfg = (fs::path(path) / "config.json").string();
    if (!fs::is_regular_file(cfg, ec)) {
      throw DataError(fmt::format("{}: a directory without config.json: not a Hugging Face checkpoint", path));
    }
    if (gpt) checkHfGpt2Config(readHfJson(cfg), o, config.activation, cfg);
    std::string file;
    auto source = openDirectoryWeights(path, file);
    if (llama) {
      checkLlama(cfg, config, *source, file);
      return source;
    }
    if (bert) {
      checkBert(cfg, config);
      return hfBertAsCohort(std::move(source), bertOptions(config, config.vocabSize), file);
    }
    if (!isHfGpt2(source->entries())) return source;
    return hfGpt2AsCohort(std::move(source), file);
  }
  const std::string json = ".index.json";
  auto source = path.size() > json.size() && path.compare(path.size() - json.size(), json.size(), json) == 0
                    ? openShardedWeights(path)
                    : ckpt::openWeights(path);
  const fs::path beside = fs::path(path).parent_path() / "config.json";
  if (llama) {
    if (fs::is_regular_file(beside, ec)) checkLlama(beside.string(), config, *source, path);
    return source;
  }
  if (bert) {
    if (fs::is_regular_file(beside, ec)) checkBert(beside.string(), config);
    return hfBertAsCohort(std::move(source), bertOptions(config, config.vocabSize), path);
  }
  if (!gpt || !isHfGpt2(source->entries())) return source;
  if (fs::is_regular_file(beside, ec)) {
    checkHfGpt2Config(readHfJson(beside.string()), o, config.activation, beside.string());
  }
  return hfGpt2AsCohort(std::move(source), path);
}

}  // namespace cohort::models
