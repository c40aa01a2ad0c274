#pragma once

// `--sweep key.path=v1,v2,...`: the points of a hyper-parameter sweep. Several
// --sweep options span their product, the first varying slowest.

#include <string>
#include <vector>

namespace cohort::cluster {

struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
};

struct SweepPoint {
  std::vector<std::string> overrides;  // "key.path=value", one per axis
  std::string label;                   // "lr=0.05,batch_size=64": a directory name part
};

// Throws UsageError naming the option for one that is not key=v1[,v2...],
// an empty value, or a key given twice.
std::vector<SweepAxis> parseSweeps(const std::vector<std::string>& options);

// Every point of the product (one point without overrides when `axes` is empty).
std::vector<SweepPoint> sweepPoints(const std::vector<SweepAxis>& axes);

}  // namespace cohort::cluster
