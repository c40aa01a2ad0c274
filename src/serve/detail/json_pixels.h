#pragma once

// The common body of POST /v1/predict, {"inputs": IMAGES} with "top_k" and
// "logits" optional, read straight into floats. A general JSON parse of a
// 224x224 RGB image builds a document of 150,528 numbers first (about 12 ms
// here); this reads them in one pass. Anything it does not expect (a syntax
// error, another key, "shape", a number that is not a plain decimal in
// 0..255, a wrong size) is left to the general parser (request.cc), which
// says what is wrong: both give the same inputs where both accept
// (fuzz/serve_request_fuzz.cc compares them).

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace cohort::serve::detail {

struct ScannedPredict {
  std::vector<float> pixels;  // images x channels x height x width, raw 0..255
  int64_t images = 0;
  std::optional<int64_t> topK;  // "top_k", an integer in [1, 1000000]
  std::optional<bool> logits;   // "logits"
};

// IMAGES is one image [C][H][W] or a list of 1..maxInputs of them, of the
// model's channels, height and width.
std::optional<ScannedPredict> scanPredictJson(std::string_view body, int64_t channels, int64_t height,
                                              int64_t width, int64_t maxInputs);

}  // namespace cohort::serve::detail
