#include "cohort/serve/model.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <caffe2/serialize/inline_container.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <set>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/resume.h"
#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "cohort/core/run_dir.h"
#include "cohort/data/dataset.h"
#include "cohort/data/shard_source.h"
#include "cohort/data/tokenizer.h"
#include "cohort/data/tokens.h"
#include "cohort/data/transform.h"
#include "cohort/ckpt/weights.h"
#include "cohort/models/gpt.h"
#include "cohort/models/pretrained.h"
#include "cohort/models/lora.h"
#include "cohort/models/unit_runner.h"
#include "cohort/storage/storage.h"
#include "cohort/core/malloc_policy.h"
#include "cohort/infer/weights.h"
#include "serve/detail/split.h"

namespace cohort::serve {

namespace fs = std::filesystem;

namespace {

// The job file above `path`: RUN/job.yaml for RUN, RUN/model/final.pt or
// RUN/checkpoints/step-N; "" when there is none within three levels.
std::string findJob(const fs::path& path) {
  std::error_code ec;
  fs::path dir = fs::is_directory(path, ec) ? path : path.parent_path();
  for (int up = 0; up < 3 && !dir.empty(); ++up) {
    if (fs::is_regular_file(dir / "job.yaml", ec)) return (dir / "job.yaml").string();
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  return "";
}

// A directory of Hugging Face's layout (config.json and the weights).
bool isHuggingFaceDir(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(path) / "config.json", ec);
}

// Loads the weights MODEL names: a run directory's trained weights, a
// checkpoint directory, a weights file, or a Hugging Face checkpoint.
std::string loadWeightsFrom(models::Model& model, const JobConfig& job, const std::string& path,
                            const std::string& runDir) {
  std::error_code ec;
  if (!runDir.empty() && fs::equivalent(path, runDir, ec)) {
    return infer::loadTrainedWeights(model, job, RunDir{runDir});
  }
  if (fs::is_directory(path, ec) && !isHuggingFaceDir(path)) {
    if (!fs::is_regular_file(fs::path(path) / "manifest.json", ec)) {
      throw UsageError(fmt::format("{}: neither a run directory, a checkpoint (no manifest.json) nor a Hugging "
                                   "Face checkpoint (no config.json)",
                                   path));
    }
    const ckpt::Manifest manifest = ckpt::readManifest(path);
    std::string base;
    if (job.model.lora.rank > 0) {
      // Its adapters only: the frozen weights are model.init_from's or the
      // run's model/base.pt, and must be those training recorded.
      if (runDir.empty() && job.model.initFrom.empty()) {
        throw DataError(fmt::format("{}: a LoRA checkpoint without model.init_from needs its run directory, "
                                    "whose model/base.pt holds the frozen weights",
                                    path));
      }
      base = infer::loadLoraBase(model, job, RunDir{runDir});
    }
    ckpt::CheckpointTensors checkpoint(path, manifest);  // one tensor at a time
    ckpt::loadStateDict(models::trainedState(model), checkpoint, checkpoint.entries(), path + "/model.bin");
    if (base.empty()) return path;
    infer::checkLoraBase(model, manifest.extra.value("lora_base_digest", ""), path, base);
    return base + " + " + path;
  }
  if (!fs::exists(path, ec)) throw UsageError(fmt::format("{}: no such file or directory", path));
  const auto file = models::openPretrained(path, job.model);  // one tensor at a time: no second copy
  models::loadWeights(model, *file, path);
  return path;
}

// Shape, normalization and class names from the job's training data.
void describeInput(ModelInfo& info, const JobConfig& job) {
  const DatasetConfig& d = job.data.train;
  CacheConfig noCache;
  noCache.enabled = false;
  const auto storageOptions = storage::storageOptions(job.storage);
  bool encoded = false;  // shards of JPEG/PNG images (not raw pixels)
  if (d.kind == DataKind::textClasses) {
    info.texts = true;
    info.text = data::loadTokenizerFile(d.tokenizer);
    info.tokenizer = info.text->name();
    info.tokenizerVocab = info.text->vocabSize();
    info.blockSize = job.model.blockSize;
    return;
  }
  if (d.kind == DataKind::shards || d.kind == DataKind::tokens) {
    const data::ShardSource source(d.path, storageOptions, noCache);
    info.classes = source.manifest().classes;
    info.tokenizer = source.manifest().tokenizer;
    info.tokenizerVocab = source.manifest().vocabSize;
    if (d.kind == DataKind::tokens) {
      info.text = data::datasetTokenizer(source);
      if (info.text->model().empty()) info.text = nullptr;  // the byte tokenizer: nothing to carry
    }
    encoded = d.kind == DataKind::shards && source.manifest().encoding != "raw";
  }
  if (tokenModel(job)) {
    if (info.tokenizer.empty()) info.tokenizer = data::kByteTokenizer;
    if (info.tokenizerVocab == 0) info.tokenizerVocab = data::kByteVocabSize;
    return;
  }
  data::OpenOptions o;
  o.storage = storageOptions;
  o.cache = noCache;
  const auto dataset = data::openDataset(d, job.model.numClasses, o);
  const data::SampleShape shape = dataset->shape();
  info.channels = job.model.inChannels > 0 ? job.model.inChannels : shape.channels;
  info.height = shape.height;
  info.width = shape.width;
  const auto t = data::Transform::fromConfig(d, shape, false, "data.train");
  for (int64_t c = 0; c < info.channels; ++c) {
    const auto at = [&](const std::vector<float>& v, double none) {
      return v.empty() ? none : static_cast<double>(v[v.size() == 1 ? 0 : static_cast<size_t>(c)]);
    };
    info.mean.push_back(at(t.mean, 0.0));
    info.std.push_back(at(t.std, 1.0));
  }
  // An encoded image is resized as the training data's eval transform does;
  // other data was trained at its stored size: a plain resize to it.
  info.resize = encoded ? (d.resizeSize > 0 ? d.resizeSize : std::lround(d.cropSize / 0.875))
                        : std::max(shape.height, shape.width);
}

// The trained tensors MODEL names as a TensorSource, checked against the
// names and shapes of the model `mc` builds (built without values, as a
// ZeRO-3 fit check builds it): t.weights and t.info.weights.
void openWeights(TrainedModel& t, const ModelConfig& mc, const std::string& path) {
  std::error_code ec;
  std::string from = path;
  if (!t.runDir.empty() && fs::equivalent(path, t.runDir, ec)) {
    const RunDir run{t.runDir};
    from = run.finalWeights();
    if (!fs::is_regular_file(from, ec)) {
      auto point = ckpt::newestValidCheckpoint(ckpt::checkpointDir(t.job, run));
      if (!point) {
        throw DataError(fmt::format("{}: no trained weights (neither model/final.pt, final.safetensors nor a valid checkpoint)",
                                    t.runDir));
      }
      from = point->path;
    }
  }
  if (fs::is_directory(from, ec) && !isHuggingFaceDir(from)) {
    if (!fs::is_regular_file(fs::path(from) / "manifest.json", ec)) {
      throw UsageError(fmt::format("{}: neither a run directory, a checkpoint (no manifest.json) nor a Hugging "
                                   "Face checkpoint (no config.json)",
                                   from));
    }
    t.weights = std::make_shared<ckpt::CheckpointTensors>(from, ckpt::readManifest(from));
    t.info.weights = from == path ? path : from + "/model.bin";
  } else {
    if (!fs::exists(from, ec)) throw UsageError(fmt::format("{}: no such file or directory", from));
    t.weights = models::openPretrained(from, mc);
    t.info.weights = from;
  }
  // Each block is built and dropped, and each tensor read and dropped:
  // from glibc's heap their holes would stay resident (about the model's
  // size in all), mapped they are given back.
  mapLargeBlocks();
  models::ShapesOnly shapes;
  models::ModelPart part;
  part.sink = &shapes;
  part.exact = false;
  const auto shaped = models::createModel(mc, {t.info.channels, t.info.height, t.info.width}, part);
  std::set<std::string> seconds;  // second names of tied tensors: a file may hold them or not
  for (const auto& [second, name] : models::tiedNamesOf(mc)) seconds.insert(second);
  std::map<std::string, at::Tensor> given;
  for (const auto& [name, e] : t.weights->entries()) {
    if (seconds.count(name) == 0) given.emplace(name, e);
  }
  for (const auto& b : shaped->named_buffers()) t.buffers.insert(b.key());
  for (const auto& [name, want] : models::publishedStateDict(*shaped)) {
    t.order.push_back(name);
    if (seconds.count(name) != 0) continue;
    auto it = given.find(name);
    if (it == given.end()) {
      throw DataError(fmt::format("{}: missing tensor '{}' that the model needs", t.info.weights, name));
    }
    if (!it->second.sizes().equals(want.sizes())) {
      throw DataError(fmt::format("{}: tensor '{}' has shape [{}], the model's is [{}]", t.info.weights, name,
                                  fmt::join(it->second.sizes(), ", "), fmt::join(want.sizes(), ", ")));
    }
    given.erase(it);
  }
  if (!given.empty()) {
    throw DataError(fmt::format("{}: unexpected tensor '{}': the model has no such parameter or buffer",
                                t.info.weights, given.begin()->first));
  }
}

}  // namespace

TrainedModel loadTrainedModel(const std::string& model, const std::string& jobPath, bool weightsOnly) {
  TrainedModel t;
  std::error_code ec;
  if (!fs::exists(model, ec)) throw UsageError(fmt::format("{}: no such file or directory", model));
  const std::string found = findJob(model);
  if (!found.empty()) t.runDir = fs::path(found).parent_path().string();
  const std::string job = jobPath.empty() ? found : jobPath;
  if (job.empty()) {
    throw UsageError(fmt::format("{}: no job.yaml beside it or above it; pass --job JOB.yaml naming its "
                                 "architecture",
                                 model));
  }
  t.job = loadJob(job);
  ModelInfo& info = t.info;
  info.arch = std::string(choiceName(t.job.model.arch));
  info.tokens = tokenModel(t.job);
  describeInput(info, t.job);

  torch::NoGradGuard noGrad;
  ModelConfig mc = t.job.model;
  if (info.tokens) {
    if (mc.vocabSize == 0) mc.vocabSize = info.tokenizerVocab;
    info.vocabSize = mc.vocabSize;
    info.blockSize = mc.blockSize;
  } else if (info.texts) {
    if (mc.vocabSize == 0) mc.vocabSize = info.tokenizerVocab;
    mc.padToken = info.text->tokenId("[PAD]");
    info.vocabSize = mc.vocabSize;
    info.numClasses = mc.numClasses;
  } else {
    if (mc.inChannels == 0) mc.inChannels = info.channels;
    info.numClasses = mc.numClasses;
  }
  // The contiguous layout: what every runtime an export goes to expects,
  // and serving's batches are small.
  mc.memoryFormat = MemoryLayout::contiguous;
  if (weightsOnly && decoderArch(mc.arch) && mc.lora.rank == 0) {
    openWeights(t, mc, model);
    return t;
  }
  t.model = models::createModel(mc, {info.channels, info.height, info.width});
  info.weights = loadWeightsFrom(*t.model, t.job, model, t.runDir);
  t.model->eval();
  return t;
}

bool isScriptExport(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    return reader.hasRecord(std::string("extra/") + kInfoExtraFile);
  } catch (const std::exception&) {
    return false;
  }
}

namespace {

std::string describeSizes(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d > 0 ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

}  // namespace

namespace detail {

void checkInput(const at::Tensor& input, const ModelInfo& info) {
  if (info.tokens || info.texts) {
    if (input.dim() != 2 || input.scalar_type() != torch::kLong) {
      throw DataError(fmt::format("expected token ids int64 [batch, time], got {} {}",
                                  c10::toString(input.scalar_type()), describeSizes(input)));
    }
    if (input.size(1) < 1 || input.size(1) > info.blockSize) {
      throw DataError(fmt::format("a sequence of {} tokens: the model takes 1 to {} (block_size)",
                                  input.size(1), info.blockSize));
    }
    if (input.numel() > 0 && (input.min().item<int64_t>() < 0 || input.max().item<int64_t>() >= info.vocabSize)) {
      throw DataError(fmt::format("token ids must be in [0, {})", info.vocabSize));
    }
    return;
  }
  if (input.dim() != 4 || input.size(1) != info.channels || input.size(2) != info.height ||
      input.size(3) != info.width || !input.is_floating_point()) {
    throw DataError(fmt::format("expected pixels float [batch, {}, {}, {}], got {} {}", info.channels,
                                info.height, info.width, c10::toString(input.scalar_type()),
                                describeSizes(input)));
  }
}

}  // namespace detail

namespace {

using detail::checkInput;

class ZooPredictor : public Predictor {
 public:
  // A CNN computes channels-last here: LibTorch's inference of ResNet-18 on
  // CPU took 7% less time at batch 1 and 22% at batch 8 (docs/deploy.md);
  // and with its BatchNorms folded into the convolutions (docs/deploy.md).
  // The function is the same up to rounding; exports keep the contiguous
  // layout and the BatchNorms.
  explicit ZooPredictor(TrainedModel m) : m_(std::move(m)) {
    if (!m_.info.tokens && !m_.info.texts && m_.info.arch != "torchscript") m_.model->setChannelsLast(true);
    m_.model->foldForInference();
  }
  const ModelInfo& info() const override { return m_.info; }
  at::Tensor forward(const at::Tensor& input) override {
    checkInput(input, m_.info);
    c10::InferenceMode guard;
    return m_.model->forward(m_.info.tokens || m_.info.texts ? input : normalizePixels(input, m_.info));
  }
  bool decodes() const override { return m_.info.tokens && m_.model->decodes(); }
  at::Tensor decode(const std::vector<at::Tensor>& rows, const std::vector<models::KvCache*>& caches) override {
    for (const at::Tensor& row : rows) checkInput(row.unsqueeze(0), m_.info);
    c10::InferenceMode guard;
    return m_.model->decode(rows, caches);
  }

 private:
  TrainedModel m_;
};

class ScriptPredictor : public Predictor {
 public:
  ScriptPredictor(torch::jit::Module module, ModelInfo info)
      : module_(std::move(module)), info_(std::move(info)) {
    module_.eval();
  }
  const ModelInfo& info() const override { return info_; }
  at::Tensor forward(const at::Tensor& input) override {
    checkInput(input, info_);
    c10::InferenceMode guard;
    c10::IValue out = module_.forward({info_.tokens ? input : input.to(torch::kFloat)});
    return out.toTensor();
  }

 private:
  torch::jit::Module module_;
  ModelInfo info_;
};

}  // namespace

at::Tensor Predictor::decode(const std::vector<at::Tensor>&, const std::vector<models::KvCache*>&) {
  throw Error("this model keeps no key/value cache");
}

std::unique_ptr<Predictor> openPredictor(const std::string& model, const std::string& jobPath) {
  std::error_code ec;
  const bool script = isScriptExport(model);
  if (script || (jobPath.empty() && fs::is_regular_file(model, ec) && findJob(model).empty())) {
    // A TorchScript export carrying its ModelInfo (wherever it is), or a
    // file outside a run directory that can only be one.
    torch::jit::ExtraFilesMap extra{{kInfoExtraFile, ""}, {kTokenizerExtraFile, ""}};
    torch::jit::Module module;
    try {
      module = torch::jit::load(model, torch::kCPU, extra);
    } catch (const c10::Error& e) {
      throw UsageError(fmt::format("{}: not a TorchScript export of cohort, and no job.yaml above it "
                                   "(pass --job JOB.yaml for a weights file): {}",
                                   model, e.what_without_backtrace()));
    }
    if (extra[kInfoExtraFile].empty()) {
      throw UsageError(fmt::format("{}: a TorchScript module without {} (write it with `cohort export "
                                   "--format torchscript`)",
                                   model, kInfoExtraFile));
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(extra[kInfoExtraFile]);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: {}: {}", model, kInfoExtraFile, e.what()));
    }
    ModelInfo info = ModelInfo::fromJson(j, model);
    if (!extra[kTokenizerExtraFile].empty()) {
      info.text = data::makeTokenizer(info.tokenizer, extra[kTokenizerExtraFile],
                                      model + " (extra file " + kTokenizerExtraFile + ")");
    }
    return std::make_unique<ScriptPredictor>(std::move(module), std::move(info));
  }
  TrainedModel trained = loadTrainedModel(model, jobPath);
  if (maskedLm(trained.job)) {
    throw UsageError(fmt::format("{}: a bert pretrained by masked language modelling fills in masked tokens, which "
                                 "cohort serve does not answer; serve it fine-tuned (model.task classify)",
                                 model));
  }
  return std::make_unique<ZooPredictor>(std::move(trained));
}

}  // namespace cohort::serve
