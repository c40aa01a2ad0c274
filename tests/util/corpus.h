#pragma once

// Text for the language-model tests: sentences from a small vocabulary in
// a pseudo-random order (a model that learns words and their spelling beats
// the byte frequencies by far), and that baseline.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>

namespace cohort::test {

// `bytes` bytes of text; `seed` picks another order of the same words.
inline std::string corpus(size_t bytes, uint64_t seed = 12345) {
  const char* words[] = {"the ", "lord ", "said ", "unto ", "moses ", "and ", "people ",
                         "went ", "out ", "of ", "land ", "egypt ", "in ", "day "};
  std::string s;
  uint64_t x = seed;
  while (s.size() < bytes) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += words[(x >> 33) % 14];
    if ((x >> 20) % 9 == 0) s += ".\n";
  }
  s.resize(bytes);
  return s;
}

// Cross-entropy in nats of `text` under the byte frequencies of `fit`.
inline double unigramLoss(const std::string& fit, const std::string& text) {
  std::map<unsigned char, double> count;
  for (unsigned char c : fit) count[c] += 1;
  double sum = 0;
  for (unsigned char c : text) sum -= std::log(std::max(count[c], 0.5) / double(fit.size()));
  return sum / double(text.size());
}

}  // namespace cohort::test
