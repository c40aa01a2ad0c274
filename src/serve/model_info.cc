// The client's side of a model (serve/model.h): ModelInfo as JSON, and raw
// pixels from an encoded image or into the network's input. Apart from the
// loading of trained models, so that the request parser and its fuzz target
// need nothing of training.

#include <fmt/format.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "cohort/core/error.h"
#include "cohort/data/image.h"
#include "cohort/serve/model.h"

namespace cohort::serve {

nlohmann::json ModelInfo::toJson() const {
  nlohmann::json j = {{"format", 1}, {"arch", arch}, {"tokens", tokens}, {"weights", weights}};
  if (tokens) {
    j["input"] = {{"name", "tokens"}, {"dtype", "int64"}, {"shape", {"batch", "time"}}};
    j["output"] = {{"name", "logits"}, {"dtype", "float32"}, {"shape", {"batch", "time", vocabSize}}};
    j["tokenizer"] = tokenizer;
    j["vocab_size"] = vocabSize;
    j["tokenizer_vocab"] = tokenizerVocab;
    j["block_size"] = blockSize;
  } else if (texts) {
    j["texts"] = true;
    j["input"] = {{"name", "tokens"}, {"dtype", "int64"}, {"shape", {"batch", blockSize}}};
    j["output"] = {{"name", "logits"}, {"dtype", "float32"}, {"shape", {"batch", numClasses}}};
    j["tokenizer"] = tokenizer;
    j["block_size"] = blockSize;
    j["num_classes"] = numClasses;
  } else {
    j["input"] = {{"name", "pixels"}, {"dtype", "float32"},
                  {"shape", {"batch", channels, height, width}}, {"range", {0, 255}}};
    j["output"] = {{"name", "logits"}, {"dtype", "float32"}, {"shape", {"batch", numClasses}}};
    j["normalization"] = {{"folded", true}, {"scale", 1.0 / 255}, {"mean", mean}, {"std", std}};
    j["resize"] = resize;
    j["num_classes"] = numClasses;
    j["classes"] = classes;
  }
  return j;
}

const data::Tokenizer& textTokenizer(const ModelInfo& info) {
  if (info.text) return *info.text;
  if (info.tokenizer.empty() || info.tokenizer == data::kByteTokenizer) return *data::byteTokenizer();
  throw DataError(fmt::format("the model's tokenizer '{}' did not come with it", info.tokenizer));
}

ModelInfo ModelInfo::fromJson(const nlohmann::json& j, const std::string& origin) {
  ModelInfo m;
  try {
    m.arch = j.at("arch").get<std::string>();
    m.tokens = j.at("tokens").get<bool>();
    m.weights = j.value("weights", "");
    if (m.tokens) {
      m.tokenizer = j.at("tokenizer").get<std::string>();
      m.vocabSize = j.at("vocab_size").get<int64_t>();
      m.tokenizerVocab = j.at("tokenizer_vocab").get<int64_t>();
      m.blockSize = j.at("block_size").get<int64_t>();
    } else {
      const auto& shape = j.at("input").at("shape");
      m.channels = shape.at(1).get<int64_t>();
      m.height = shape.at(2).get<int64_t>();
      m.width = shape.at(3).get<int64_t>();
      m.mean = j.at("normalization").at("mean").get<std::vector<double>>();
      m.std = j.at("normalization").at("std").get<std::vector<double>>();
      m.resize = j.at("resize").get<int64_t>();
      m.numClasses = j.at("num_classes").get<int64_t>();
      m.classes = j.at("classes").get<std::vector<std::string>>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: model information ({}): {}", origin, kInfoExtraFile, e.what()));
  }
  return m;
}

std::string ModelInfo::className(int64_t label) const {
  if (label >= 0 && label < static_cast<int64_t>(classes.size())) return classes[static_cast<size_t>(label)];
  return std::to_string(label);
}

at::Tensor normalizePixels(const at::Tensor& raw, const ModelInfo& info) {
  const auto opts = raw.options().dtype(torch::kFloat);
  const at::Tensor mean = torch::tensor(info.mean, opts.dtype(torch::kDouble)).to(opts).view({1, -1, 1, 1});
  const at::Tensor std = torch::tensor(info.std, opts.dtype(torch::kDouble)).to(opts).view({1, -1, 1, 1});
  return (raw.to(torch::kFloat) / 255.0f - mean) / std;
}

data::ImageTransform evalTransform(const ModelInfo& info) {
  if (info.tokens || (info.channels != 1 && info.channels != 3)) {
    throw DataError(fmt::format("the model ({}) takes {}: send {} as JSON, not an encoded image", info.arch,
                                info.tokens ? "tokens" : fmt::format("{} channels", info.channels),
                                info.tokens ? "a prompt" : "pixels"));
  }
  data::ImageTransform t;
  t.outHeight = info.height;
  t.outWidth = info.width;
  t.channels = info.channels;
  t.resizeShorter = info.resize;
  t.validate();
  return t;
}

at::Tensor pixelsFromImage(const uint8_t* bytes, size_t size, const ModelInfo& info) {
  const data::ImageTransform t = evalTransform(info);
  try {
    const data::ImageInfo header = data::probeImage(bytes, size);
    if (header.height * header.width > kMaxImagePixels) {
      throw DataError(fmt::format("an image of {}x{} px is larger than cohort decodes ({} Mpx)", header.width,
                                  header.height, kMaxImagePixels >> 20));
    }
    at::Tensor pixels = torch::empty({info.channels, info.height, info.width}, torch::kFloat);
    data::decodeImage(bytes, size, t, 0, pixels.data_ptr<float>());
    // Resampling's float sums can end a hair above 1 (255.00003 here): the
    // contract is 0..255, as a client's own pixels are checked.
    return pixels.mul_(255.0f).clamp_(0.0f, 255.0f);
  } catch (const Error& e) {
    throw DataError(fmt::format("the image does not decode: {}", e.what()));
  }
}

}  // namespace cohort::serve
