#pragma once

// The training rate of a `cohort run`, as the side-by-side benchmarks
// (ddp.cc, gpt.cc) read it from the run's metrics.jsonl.

#include <exception>
#include <string>
#include <thread>
#include <utility>
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

// run() twice at the same time (two 1-rank runs: the no-communication
// ceiling of a 2-rank run on this machine); both results, or the first
// exception either threw, after both have ended.
template <typename Run>
auto together(Run run) {
  decltype(run()) a, b;
  std::exception_ptr failed;  // rethrown here: a throw inside the thread would end the process
  std::thread other([&] {
    try {
      b = run();
    } catch (...) {
      failed = std::current_exception();
    }
  });
  try {
    a = run();
  } catch (...) {
    other.join();
    throw;
  }
  other.join();
  if (failed) std::rethrow_exception(failed);
  return std::make_pair(std::move(a), std::move(b));
}

}  // namespace cohort::bench
