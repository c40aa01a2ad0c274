#pragma once

// The training rate of a `cohort run`, as the side-by-side benchmarks
// (ddp.cc, gpt.cc) read it from the run's metrics.jsonl.

#include <string>
#include <vector>

#include "util/jobs.h"

namespace cohort::bench {

// The rate over equal windows (the same number of steps and samples each):
// samples over seconds, i.e. the harmonic mean of the windows' rates, as the
// PyTorch peers measure (samples over seconds after warm-up).
inline double overallRate(const std::vector<double>& rates) {
  double inverse = 0;
  for (double r : rates) inverse += 1 / r;
  return rates.empty() ? 0 : double(rates.size()) / inverse;
}

// `field` ("images_per_s", "tokens_per_s") of the run's train records after
// the first (the warm-up window); empty when there is none.
inline std::vector<double> windowRates(const std::string& run, const std::string& field) {
  std::vector<double> windows;
  bool first = true;
  for (const auto& j : test::readJsonLines(run + "/metrics.jsonl")) {
    if (j["event"] != "train") continue;
    if (first) {
      first = false;
      continue;
    }
    windows.push_back(j[field].get<double>());
  }
  return windows;
}

}  // namespace cohort::bench
