#include "cohort/monitor/straggler.h"

#include <fmt/format.h>

#include <algorithm>

namespace cohort::monitor {

std::vector<Straggler> findStragglers(const std::vector<double>& msPerStep, double factor) {
  std::vector<Straggler> out;
  const size_t n = msPerStep.size();
  if (n < 2 || factor <= 0) return out;
  for (size_t r = 0; r < n; ++r) {
    std::vector<double> others;
    for (size_t k = 0; k < n; ++k) {
      if (k != r) others.push_back(msPerStep[k]);
    }
    std::sort(others.begin(), others.end());
    const size_t m = others.size();
    const double median = m % 2 == 1 ? others[m / 2] : 0.5 * (others[m / 2 - 1] + others[m / 2]);
    if (median > 0 && msPerStep[r] > factor * median &&
        msPerStep[r] - median >= kMinStragglerGapMs) {
      out.push_back({static_cast<int>(r), msPerStep[r], median});
    }
  }
  return out;
}

std::string describe(const Straggler& s) {
  return fmt::format("rank {}: {:.1f} ms of compute per step, {:.1f}x the median of the others "
                     "({:.1f} ms)",
                     s.rank, s.ms, s.medianMs > 0 ? s.ms / s.medianMs : 0.0, s.medianMs);
}

}  // namespace cohort::monitor
