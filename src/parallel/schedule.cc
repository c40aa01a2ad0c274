// The pipeline's schedules and the split of blocks into stages: pure
// functions (parallel/pipeline.h), tested on their own.

#include <algorithm>
#include <limits>
#include <numeric>

#include "cohort/core/error.h"
#include "cohort/parallel/pipeline.h"

namespace cohort::parallel {

std::vector<ScheduleStep> scheduleOf(ScheduleKind kind, int stage, int stages, int micro) {
  std::vector<ScheduleStep> steps;
  steps.reserve(static_cast<size_t>(2 * micro));
  // GPipe fills the pipeline with every micro-batch; 1F1B with just enough
  // for the last stage to start its backwards (the later a stage, the
  // fewer it runs ahead).
  const int warmup = kind == ScheduleKind::gpipe ? micro : std::min(stages - stage - 1, micro);
  for (int i = 0; i < warmup; ++i) steps.push_back({true, i});
  for (int i = 0; i < micro - warmup; ++i) {
    steps.push_back({true, warmup + i});
    steps.push_back({false, i});
  }
  for (int i = micro - warmup; i < micro; ++i) steps.push_back({false, i});
  return steps;
}

double bubbleFraction(int stages, int micro) {
  return micro + stages - 1 > 0 ? static_cast<double>(stages - 1) / static_cast<double>(micro + stages - 1)
                                 : 0.0;
}

std::vector<int64_t> balanceStages(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  COHORT_ASSERT(stages >= 1 && stages <= n, stages, " stages for ", n, " blocks");
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + costs[static_cast<size_t>(i)];
  auto sum = [&](int a, int b) { return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)]; };
  // best[p][i]: the smallest largest stage of blocks [0, i) over p stages;
  // cut[p][i]: where the last of those stages starts.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(n) + 1, inf));
  std::vector<std::vector<int>> cut(static_cast<size_t>(stages) + 1, std::vector<int>(static_cast<size_t>(n) + 1, 0));
  best[0][0] = 0;
  for (int p = 1; p <= stages; ++p) {
    for (int i = p; i <= n; ++i) {
      // The last stage is [j, i); an earlier start (more blocks at the
      // end) keeps a tie, so earlier stages take fewer: under 1F1B they
      // hold the activations of more micro-batches.
      for (int j = p - 1; j <= i - 1; ++j) {
        const double worst = std::max(best[static_cast<size_t>(p) - 1][static_cast<size_t>(j)], sum(j, i));
        if (worst < best[static_cast<size_t>(p)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(p)][static_cast<size_t>(i)] = worst;
          cut[static_cast<size_t>(p)][static_cast<size_t>(i)] = j;
        }
      }
    }
  }
  std::vector<int64_t> blocks(static_cast<size_t>(stages));
  for (int p = stages, i = n; p >= 1; --p) {
    const int j = cut[static_cast<size_t>(p)][static_cast<size_t>(i)];
    blocks[static_cast<size_t>(p) - 1] = i - j;
    i = j;
  }
  return blocks;
}

}  // namespace cohort::parallel
