// The JSON body of POST /v1/predict read into the model's input: the fast
// reader (src/serve/json_pixels.cc, what `cohort serve` runs) against the
// general parser alone (an nlohmann document, then a copy: what it ran
// before), side by side on the same bodies, interleaved, repeated; the
// median per size. Prints the CPU.
//
//   build/bench/cohort_bench_request [--repeats 21]

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "cohort/core/cpu.h"
#include "serve/detail/request.h"

using namespace cohort;
using Clock = std::chrono::steady_clock;

namespace {

serve::ModelInfo rgbModel(int64_t side) {
  serve::ModelInfo m;
  m.arch = "resnet18";
  m.channels = 3;
  m.height = side;
  m.width = side;
  m.mean = {0.485, 0.456, 0.406};
  m.std = {0.229, 0.224, 0.225};
  m.numClasses = 1000;
  return m;
}

// One image as nested arrays of integers 0..255, as a client writes it.
std::string body(int64_t side) {
  std::string s = "{\"inputs\": [";
  for (int64_t c = 0; c < 3; ++c) {
    s += c ? ",[" : "[";
    for (int64_t h = 0; h < side; ++h) {
      s += h ? ",[" : "[";
      for (int64_t w = 0; w < side; ++w) {
        if (w) s += ",";
        s += std::to_string((c * 31 + h * 7 + w * 13) % 256);
      }
      s += "]";
    }
    s += "]";
  }
  return s + "]}";
}

double millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 21;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
  }
  fmt::print("cpu: {}\n", describe(cpuInfo()));
  for (int64_t side : {64, 224}) {
    const serve::ModelInfo info = rgbModel(side);
    const std::string b = body(side);
    std::vector<double> fast, general;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = Clock::now();
      const auto a = serve::detail::parsePredict(b, "application/json", std::nullopt, std::nullopt, info, 5, 64);
      auto t1 = Clock::now();
      const auto g = serve::detail::parsePredictJsonGeneral(b, info, 5, 64);
      auto t2 = Clock::now();
      if (!torch::equal(a.inputs.at(0), g.inputs.at(0))) {
        fmt::print(stderr, "the two readers disagree\n");
        return 1;
      }
      fast.push_back(millis(t1 - t0));
      general.push_back(millis(t2 - t1));
    }
    const double f = median(fast), g = median(general);
    fmt::print("{}x{} RGB body ({} KB), median of {}: fast reader {:.2f} ms, general parser {:.2f} ms: {:.1f}x\n",
               side, side, b.size() / 1024, repeats, f, g, g / f);
  }
  return 0;
}
