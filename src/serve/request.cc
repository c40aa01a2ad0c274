#include "serve/detail/request.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "cohort/core/error.h"
#include "cohort/data/tokenizer.h"
#include "cohort/data/tokens.h"
#include "serve/detail/json_pixels.h"

namespace cohort::serve::detail {

namespace {

using nlohmann::json;

bool startsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool looksLikeImage(const std::string& body) {
  static const std::string kJpeg = "\xFF\xD8\xFF";
  static const std::string kPng = "\x89PNG\r\n\x1A\n";
  return startsWith(body, kJpeg.c_str()) || body.compare(0, kPng.size(), kPng) == 0;
}

std::string lowerType(const std::string& contentType) {
  std::string t = contentType.substr(0, contentType.find(';'));
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!t.empty() && t.back() == ' ') t.pop_back();
  return t;
}

json parseJson(const std::string& body) {
  if (body.empty()) throw DataError("the body is empty: send JSON or the bytes of a JPEG or PNG image");
  try {
    return json::parse(body);
  } catch (const json::exception& e) {  // a syntax error, or a number beyond double
    throw DataError(fmt::format("the body is not valid JSON (nor a JPEG or PNG image): {}", e.what()));
  }
}

void checkKeys(const json& j, std::initializer_list<const char*> known) {
  if (!j.is_object()) throw DataError("the JSON body must be an object");
  for (const auto& [key, value] : j.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
      throw DataError(fmt::format("unknown key \"{}\" (known: {})", key, list));
    }
  }
}

int64_t integerOf(const json& v, const char* key, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw DataError(fmt::format("\"{}\" must be an integer", key));
  const bool tooLarge = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi);
  if (tooLarge || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    throw DataError(fmt::format("\"{}\" must be in [{}, {}], got {}", key, lo, hi, v.dump()));
  }
  return v.get<int64_t>();
}

int64_t integerParam(const std::string& text, const char* key, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || v < lo || v > hi) {
    throw DataError(fmt::format("?{}= must be an integer in [{}, {}], got '{}'", key, lo, hi, text));
  }
  return v;
}

bool boolParam(const std::string& text, const char* key) {
  if (text == "1" || text == "true") return true;
  if (text == "0" || text == "false" || text.empty()) return false;
  throw DataError(fmt::format("?{}= must be true, false, 1 or 0, got '{}'", key, text));
}

int depthOf(const json& j) {
  int depth = 0;
  for (const json* p = &j; p->is_array(); p = &(*p)[0]) {
    ++depth;
    if (p->empty()) break;
  }
  return depth;
}

std::string indexPath(const std::vector<int64_t>& at) {
  std::string s = "inputs";
  for (int64_t i : at) s += fmt::format("[{}]", i);
  return s;
}

float pixelOf(const json& v, const std::vector<int64_t>& at) {
  if (!v.is_number()) {
    throw DataError(fmt::format("{}: expected a number (a raw pixel, 0..255), got {}", indexPath(at),
                                std::string(v.type_name())));
  }
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0 || x > 255) {
    throw DataError(fmt::format("{}: a raw pixel must be in [0, 255], got {}", indexPath(at), v.dump()));
  }
  return static_cast<float>(x);
}

// Copies nested arrays of `shape` (from dimension `dim` on) into `out`.
void fillNested(const json& j, const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t>& at,
                float*& out) {
  if (dim == shape.size()) {
    *out++ = pixelOf(j, at);
    return;
  }
  if (!j.is_array() || static_cast<int64_t>(j.size()) != shape[dim]) {
    std::string image;
    for (size_t d = shape.size() - 3; d < shape.size(); ++d) image += fmt::format("[{}]", shape[d]);
    throw DataError(fmt::format("{}: expected an array of {} values (an image is {}), got {}", indexPath(at),
                                shape[dim], image,
                                j.is_array() ? fmt::format("{} values", j.size()) : std::string(j.type_name())));
  }
  for (int64_t i = 0; i < shape[dim]; ++i) {
    at.push_back(i);
    fillNested(j[static_cast<size_t>(i)], shape, dim + 1, at, out);
    at.pop_back();
  }
}

std::vector<at::Tensor> pixelsFromJson(const json& j, const ModelInfo& info, int64_t maxInputs) {
  if (!j.contains("inputs")) throw DataError("missing \"inputs\": a list of images [C][H][W] or one image");
  const json& in = j["inputs"];
  const std::string want = fmt::format("[{}][{}][{}]", info.channels, info.height, info.width);
  const int64_t perImage = info.channels * info.height * info.width;
  int64_t n = 0;
  at::Tensor all;
  if (j.contains("shape")) {
    // A flat array of numbers with its shape: [C, H, W] or [N, C, H, W].
    const json& s = j["shape"];
    if (!s.is_array() || (s.size() != 3 && s.size() != 4)) {
      throw DataError(fmt::format("\"shape\" must be [C, H, W] or [N, C, H, W] (the model takes {})", want));
    }
    std::vector<int64_t> shape;
    for (const json& d : s) shape.push_back(integerOf(d, "shape", 0, 1 << 30));
    if (shape.size() == 3) shape.insert(shape.begin(), 1);
    if (shape[1] != info.channels || shape[2] != info.height || shape[3] != info.width) {
      throw DataError(fmt::format("\"shape\" {}: the model takes images {}", s.dump(), want));
    }
    n = shape[0];
    if (n > maxInputs) throw DataError(fmt::format("{} images in one request: at most {}", n, maxInputs));
    if (!in.is_array() || static_cast<int64_t>(in.size()) != n * perImage) {
      throw DataError(fmt::format("\"inputs\" must be a flat array of {} numbers for shape {}", n * perImage, s.dump()));
    }
    all = torch::empty({n, info.channels, info.height, info.width}, torch::kFloat);
    float* out = all.data_ptr<float>();
    std::vector<int64_t> at{0};
    for (size_t i = 0; i < in.size(); ++i) {
      at[0] = static_cast<int64_t>(i);
      *out++ = pixelOf(in[i], at);
    }
  } else {
    const int depth = depthOf(in);
    if (depth != 3 && depth != 4) {
      throw DataError(fmt::format("\"inputs\" must be one image {} or a list of them (nested arrays of "
                                  "numbers 0..255), or a flat array with \"shape\"", want));
    }
    n = depth == 3 ? 1 : static_cast<int64_t>(in.size());
    if (n > maxInputs) throw DataError(fmt::format("{} images in one request: at most {}", n, maxInputs));
    const std::vector<int64_t> shape{n, info.channels, info.height, info.width};
    all = torch::empty(shape, torch::kFloat);
    float* out = all.data_ptr<float>();
    std::vector<int64_t> at;
    if (depth == 3) {
      // One image: name its indices from the image, not the wrapping list.
      const std::vector<int64_t> one(shape.begin() + 1, shape.end());
      fillNested(in, one, 0, at, out);
    } else {
      fillNested(in, shape, 0, at, out);
    }
  }
  if (n == 0) throw DataError("\"inputs\" holds no image");
  std::vector<at::Tensor> inputs;
  for (int64_t i = 0; i < n; ++i) inputs.push_back(all[i]);
  return inputs;
}

// A JSON body through the general parser: its keys over what `r` holds.
void readJsonBody(PredictRequest& r, const std::string& body, const ModelInfo& info, int64_t maxInputs) {
  const json j = parseJson(body);
  checkKeys(j, {"inputs", "shape", "top_k", "logits"});
  if (j.contains("top_k")) r.topK = integerOf(j["top_k"], "top_k", 1, 1'000'000);
  if (j.contains("logits")) {
    if (!j["logits"].is_boolean()) throw DataError("\"logits\" must be true or false");
    r.logits = j["logits"].get<bool>();
  }
  r.inputs = pixelsFromJson(j, info, maxInputs);
}

}  // namespace

PredictRequest parsePredict(const std::string& body, const std::string& contentType,
                            const std::optional<std::string>& topKParam,
                            const std::optional<std::string>& logitsParam, const ModelInfo& info,
                            int64_t defaultTopK, int64_t maxInputs) {
  PredictRequest r;
  r.topK = defaultTopK;
  if (topKParam) r.topK = integerParam(*topKParam, "top_k", 1, 1'000'000);
  if (logitsParam) r.logits = boolParam(*logitsParam, "logits");
  const std::string type = lowerType(contentType);
  const bool image = type == "image/jpeg" || type == "image/png" ||
                     (type != "application/json" && looksLikeImage(body));
  if (image) {
    if (body.empty()) throw DataError("the body is empty: send the bytes of a JPEG or PNG image");
    // model.h's: the eval transform, and images over kMaxImagePixels refused
    // by their header before decoding.
    r.inputs.push_back(pixelsFromImage(reinterpret_cast<const uint8_t*>(body.data()), body.size(), info));
  } else if (auto scanned = scanPredictJson(body, info.channels, info.height, info.width, maxInputs)) {
    if (scanned->topK) r.topK = *scanned->topK;
    if (scanned->logits) r.logits = *scanned->logits;
    at::Tensor all = torch::empty({scanned->images, info.channels, info.height, info.width}, torch::kFloat);
    std::memcpy(all.data_ptr<float>(), scanned->pixels.data(), scanned->pixels.size() * sizeof(float));
    for (int64_t i = 0; i < scanned->images; ++i) r.inputs.push_back(all[i]);
  } else {
    readJsonBody(r, body, info, maxInputs);
  }
  r.topK = std::min(r.topK, info.numClasses);
  return r;
}

PredictRequest parseTextPredict(const std::string& body, const ModelInfo& info, int64_t defaultTopK,
                                int64_t maxInputs) {
  const json j = parseJson(body);
  checkKeys(j, {"text", "texts", "top_k", "logits"});
  PredictRequest r;
  r.topK = defaultTopK;
  if (j.contains("top_k")) r.topK = integerOf(j["top_k"], "top_k", 1, 1'000'000);
  if (j.contains("logits")) {
    if (!j["logits"].is_boolean()) throw DataError("\"logits\" must be true or false");
    r.logits = j["logits"].get<bool>();
  }
  std::vector<std::string> texts;
  if (j.contains("text") == j.contains("texts")) throw DataError("send \"text\": a string, or \"texts\": a list of them");
  if (j.contains("text")) {
    if (!j["text"].is_string()) throw DataError("\"text\" must be a string");
    texts.push_back(j["text"].get<std::string>());
  } else {
    if (!j["texts"].is_array() || j["texts"].empty()) throw DataError("\"texts\" must be a list of strings");
    if (static_cast<int64_t>(j["texts"].size()) > maxInputs) {
      throw DataError(fmt::format("{} texts in one request; at most {}", j["texts"].size(), maxInputs));
    }
    for (const json& t : j["texts"]) {
      if (!t.is_string()) throw DataError("\"texts\" must be a list of strings");
      texts.push_back(t.get<std::string>());
    }
  }
  const data::Tokenizer& tok = *info.text;
  const int64_t cls = tok.tokenId("[CLS]"), sep = tok.tokenId("[SEP]"), pad = tok.tokenId("[PAD]");
  const int64_t width = info.blockSize;
  for (const std::string& text : texts) {
    std::vector<int64_t> ids = tok.encode(text);
    const int64_t keep = std::min<int64_t>(static_cast<int64_t>(ids.size()), width - 2);
    at::Tensor row = torch::full({width}, pad, torch::kLong);
    row[0] = cls;
    for (int64_t i = 0; i < keep; ++i) row[i + 1] = ids[static_cast<size_t>(i)];
    row[keep + 1] = sep;
    r.inputs.push_back(row);
  }
  r.topK = std::min(r.topK, info.numClasses);
  return r;
}

PredictRequest parsePredictJsonGeneral(const std::string& body, const ModelInfo& info, int64_t defaultTopK,
                                       int64_t maxInputs) {
  PredictRequest r;
  r.topK = defaultTopK;
  readJsonBody(r, body, info, maxInputs);
  r.topK = std::min(r.topK, info.numClasses);
  return r;
}

void fitPrompt(std::vector<int64_t>& prompt, const ModelInfo& info, TruncatePrompt truncate) {
  // An id beyond the model's embedding would fail the forward of the whole
  // batch this prompt joins (batcher.cc, scheduler.cc): refuse it here, alone.
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= info.vocabSize) {
      throw DataError(fmt::format("the prompt's token {} is id {}: the model's vocabulary is 0..{}", i, prompt[i],
                                  info.vocabSize - 1));
    }
  }
  const auto n = static_cast<int64_t>(prompt.size());
  if (n <= info.blockSize) return;
  if (truncate == TruncatePrompt::left) {
    const int64_t keep = std::max<int64_t>(info.blockSize - 1, 1);
    prompt.erase(prompt.begin(), prompt.begin() + (n - keep));
    return;
  }
  throw DataError(fmt::format("the prompt is {} tokens: the model reads at most {} (block_size); shorten it, or "
                              "start the server with --truncate-prompt left to keep its last {}",
                              n, info.blockSize, std::max<int64_t>(info.blockSize - 1, 1)));
}

GenerateRequest parseGenerate(const std::string& body, const ModelInfo& info, int64_t maxNewTokens,
                              TruncatePrompt truncate) {
  const json j = parseJson(body);
  checkKeys(j, {"prompt", "max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "stream"});
  GenerateRequest r;
  if (!j.contains("prompt") || !j["prompt"].is_string()) throw DataError("\"prompt\" must be a string");
  std::string prompt = j["prompt"].get<std::string>();
  if (prompt.empty()) prompt = "\n";  // as `cohort generate`
  r.prompt = textTokenizer(info).encode(prompt);
  if (r.prompt.empty()) throw DataError("the prompt encodes to no tokens with this model's tokenizer");
  fitPrompt(r.prompt, info, truncate);
  if (j.contains("max_tokens")) r.maxTokens = integerOf(j["max_tokens"], "max_tokens", 0, maxNewTokens);
  r.maxTokens = std::min(r.maxTokens, maxNewTokens);
  if (j.contains("temperature")) {
    const json& t = j["temperature"];
    if (!t.is_number() || !std::isfinite(t.get<double>()) || t.get<double>() < 0 || t.get<double>() > 1e6) {
      throw DataError("\"temperature\" must be a number in [0, 1e6]");
    }
    r.sampling.temperature = t.get<double>();
  }
  if (j.contains("top_k")) r.sampling.topK = integerOf(j["top_k"], "top_k", 0, info.vocabSize);
  if (j.contains("top_p")) {
    const json& p = j["top_p"];
    if (!p.is_number() || !(p.get<double>() > 0 && p.get<double>() <= 1)) {
      throw DataError("\"top_p\" must be a number in (0, 1]");
    }
    r.sampling.topP = p.get<double>();
  }
  if (j.contains("seed")) {
    const json& s = j["seed"];
    if (!s.is_number_unsigned() && !(s.is_number_integer() && s.get<int64_t>() >= 0)) {
      throw DataError("\"seed\" must be an integer >= 0");
    }
    r.sampling.seed = s.get<uint64_t>();
  }
  if (j.contains("stop")) {
    const json& stop = j["stop"];
    const json list = stop.is_string() ? json::array({stop}) : stop;
    if (!list.is_array() || list.size() > 16) throw DataError("\"stop\" must be a string or a list of at most 16");
    for (const json& one : list) {
      if (!one.is_string() || one.get<std::string>().empty() || one.get<std::string>().size() > 256) {
        throw DataError("\"stop\" strings must be non-empty strings of at most 256 bytes");
      }
      r.stops.push_back(one.get<std::string>());
    }
  }
  if (j.contains("stream")) {
    if (!j["stream"].is_boolean()) throw DataError("\"stream\" must be true or false");
    r.stream = j["stream"].get<bool>();
  }
  return r;
}

std::string dumpJson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string errorBody(const std::string& message) { return dumpJson(json{{"error", message}}); }

}  // namespace cohort::serve::detail
