// The request bodies `cohort serve` parses (src/serve/request.cc,
// openai_request.cc): POST /v1/predict (JSON pixels, or JPEG/PNG bytes
// through cohort's decoder and the eval transform), POST /v1/generate and
// the OpenAI routes' POST /v1/completions and /v1/chat/completions, as a
// client on the network sends them.
//
// Input: one byte choosing the model and the route, one choosing the
// Content-Type, then the body. A bad body must end in a DataError (the
// server's 400); one that parses must give what the model takes: images
// [C, H, W] of raw pixels in 0..255, a top-k within the classes, a prompt of
// 1..block_size ids below the vocabulary; an OpenAI body's refusal is a 4xx,
// and what it accepts has n and logprobs within their bounds. A body the fast reader of predict
// bodies (json_pixels.h) accepts, the general parser must accept with the
// same pixels, top-k and logits flag. The answer's JSON of any text
// (dumpJson) must not throw.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "fuzz_util.h"
#include "serve/detail/json_pixels.h"
#include "serve/detail/openai_request.h"
#include "serve/detail/request.h"

namespace {

using cohort::serve::ModelInfo;

ModelInfo imageModel(int64_t channels, int64_t side, int64_t resize) {
  ModelInfo m;
  m.arch = "simple_cnn";
  m.channels = channels;
  m.height = side;
  m.width = side;
  m.mean.assign(static_cast<size_t>(channels), 0.5);
  m.std.assign(static_cast<size_t>(channels), 0.25);
  m.resize = resize;
  m.numClasses = 3;
  m.classes = {"blue", "green", "red"};
  return m;
}

ModelInfo languageModel() {
  ModelInfo m;
  m.arch = "gpt";
  m.tokens = true;
  m.tokenizer = "bytes";
  m.vocabSize = 200;  // below the byte tokenizer's 256: some prompts are refused
  m.tokenizerVocab = 200;
  m.blockSize = 16;
  return m;
}

const char* contentType(uint8_t choice) {
  switch (choice % 6) {
    case 0: return "application/json";
    case 1: return "image/jpeg";
    case 2: return "image/png";
    case 3: return "application/octet-stream";
    case 4: return "text/plain; charset=utf-8";
    default: return "";
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  if (size < 2) return 0;
  const uint8_t route = data[0];
  const std::string type = contentType(data[1]);
  const std::string body = fuzz::asString(data + 2, size - 2);
  constexpr int64_t kMaxInputs = 8;
  constexpr int64_t kMaxNewTokens = 64;

  if (route % 3 == 2) {
    const ModelInfo info = languageModel();
    serve::detail::GenerateRequest r;
    if (fuzz::expectInputError("", [&] { r = serve::detail::parseGenerate(body, info, kMaxNewTokens); })) {
      fuzz::require(!r.prompt.empty() && static_cast<int64_t>(r.prompt.size()) <= info.blockSize,
                    "a prompt of " + std::to_string(r.prompt.size()) + " tokens was accepted");
      for (int64_t id : r.prompt) {
        fuzz::require(id >= 0 && id < info.vocabSize, "prompt id " + std::to_string(id) + " was accepted");
      }
      fuzz::require(r.maxTokens >= 0 && r.maxTokens <= kMaxNewTokens, "max_tokens beyond its bound");
      fuzz::require(std::isfinite(r.sampling.temperature) && r.sampling.temperature >= 0,
                    "a temperature that cannot sample");
      fuzz::require(r.sampling.topK >= 0 && r.sampling.topK <= info.vocabSize, "top_k beyond the vocabulary");
      fuzz::require(r.sampling.topP > 0 && r.sampling.topP <= 1, "a top_p outside (0, 1]");
      fuzz::require(r.stops.size() <= 16, "more than 16 stop strings");
      for (const std::string& stop : r.stops) fuzz::require(!stop.empty() && stop.size() <= 256, "a stop string out of bounds");
    }
    // The same body on the OpenAI routes, as model "m".
    const serve::detail::OpenAILimits limits{"m", kMaxNewTokens};
    for (const bool chat : {false, true}) {
      serve::detail::OpenAIRequest o;
      try {
        o = chat ? serve::detail::parseChat(body, info, limits, serve::detail::ChatTemplate(), 1)
                 : serve::detail::parseCompletion(body, info, limits, 1);
      } catch (const serve::detail::OpenAIError& e) {
        fuzz::require(e.status >= 400 && e.status < 500, "an OpenAI refusal with status " + std::to_string(e.status));
        continue;
      } catch (const std::exception& e) {
        fuzz::finding(std::string("an OpenAI body refused other than by OpenAIError: ") + e.what());
      }
      fuzz::require(!o.generate.prompt.empty() && static_cast<int64_t>(o.generate.prompt.size()) <= info.blockSize,
                    "an OpenAI prompt of " + std::to_string(o.generate.prompt.size()) + " tokens was accepted");
      for (int64_t id : o.generate.prompt) {
        fuzz::require(id >= 0 && id < info.vocabSize, "OpenAI prompt id " + std::to_string(id) + " was accepted");
      }
      fuzz::require(o.generate.maxTokens >= 0 && o.generate.maxTokens <= kMaxNewTokens, "OpenAI max_tokens beyond its bound");
      fuzz::require(o.n >= 1 && o.n <= serve::detail::kMaxChoices, "n beyond its bound");
      fuzz::require(o.generate.logprobs >= -1 && o.generate.logprobs <= serve::detail::kMaxChatTopLogprobs,
                    "logprobs beyond their bound");
      fuzz::require(o.generate.sampling.topP > 0 && o.generate.sampling.topP <= 1, "an OpenAI top_p outside (0, 1]");
    }
  } else {
    // Gray 4x4 (resize 6) or RGB 8x8 (resize 8).
    const ModelInfo info = route % 3 == 0 ? imageModel(1, 4, 6) : imageModel(3, 8, 8);
    const std::optional<std::string> topK = (route & 0x10) != 0 ? std::optional<std::string>("2") : std::nullopt;
    serve::detail::PredictRequest r;
    if (fuzz::expectInputError("", [&] {
          r = serve::detail::parsePredict(body, type, topK, std::nullopt, info, 5, kMaxInputs);
        })) {
      fuzz::require(!r.inputs.empty() && static_cast<int64_t>(r.inputs.size()) <= kMaxInputs,
                    std::to_string(r.inputs.size()) + " inputs were accepted");
      fuzz::require(r.topK >= 1 && r.topK <= info.numClasses, "top_k " + std::to_string(r.topK) + " was accepted");
      for (const at::Tensor& x : r.inputs) {
        fuzz::require(x.scalar_type() == at::kFloat && x.dim() == 3 && x.size(0) == info.channels &&
                          x.size(1) == info.height && x.size(2) == info.width,
                      "an input of another shape or type was accepted");
        fuzz::require(x.isfinite().all().item<bool>() && x.min().item<float>() >= 0 && x.max().item<float>() <= 255,
                      "pixels outside 0..255 were accepted: " + std::to_string(x.min().item<float>()) + " to " +
                          std::to_string(x.max().item<float>()));
      }
    }
  }
  if (route % 3 != 2) {
    const ModelInfo info = route % 3 == 0 ? imageModel(1, 4, 6) : imageModel(3, 8, 8);
    if (auto scanned = serve::detail::scanPredictJson(body, info.channels, info.height, info.width, kMaxInputs)) {
      serve::detail::PredictRequest general;
      fuzz::require(fuzz::expectInputError(
                        "", [&] { general = serve::detail::parsePredictJsonGeneral(body, info, 5, kMaxInputs); }),
                    "the fast reader accepted a body the general parser refuses");
      fuzz::require(static_cast<int64_t>(general.inputs.size()) == scanned->images, "the readers count other images");
      const at::Tensor all = at::stack(general.inputs).contiguous();
      fuzz::require(static_cast<size_t>(all.numel()) == scanned->pixels.size() &&
                        std::memcmp(all.data_ptr<float>(), scanned->pixels.data(),
                                    scanned->pixels.size() * sizeof(float)) == 0,
                    "the readers disagree on a pixel");
      fuzz::require(std::min<int64_t>(scanned->topK.value_or(5), info.numClasses) == general.topK &&
                        scanned->logits.value_or(false) == general.logits,
                    "the readers disagree on top_k or logits");
    }
  }
  // The server answers with the body's text in messages and generations.
  (void)serve::detail::dumpJson(nlohmann::json(body));
  return 0;
}
