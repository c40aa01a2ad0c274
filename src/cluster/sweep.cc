#include "cohort/cluster/sweep.h"

#include <fmt/format.h>

#include <cctype>

#include "cohort/core/error.h"

namespace cohort::cluster {
namespace {

// The last part of a key path, with what a directory name should not hold
// replaced.
std::string labelPart(const std::string& key, const std::string& value) {
  const std::string leaf = key.substr(key.rfind('.') + 1);
  std::string out = leaf + "=";
  for (const char c : value) {
    out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ? c : '_';
  }
  return out;
}

}  // namespace

std::vector<SweepAxis> parseSweeps(const std::vector<std::string>& options) {
  std::vector<SweepAxis> axes;
  for (const auto& o : options) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError(fmt::format("--sweep {}: expected key.path=value1,value2,...", o));
    }
    SweepAxis a;
    a.key = o.substr(0, eq);
    const std::string list = o.substr(eq + 1);
    size_t start = 0;
    for (;;) {
      const size_t comma = list.find(',', start);
      const std::string v = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (v.empty()) throw UsageError(fmt::format("--sweep {}: an empty value", o));
      a.values.push_back(v);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    for (const auto& other : axes) {
      if (other.key == a.key) throw UsageError(fmt::format("--sweep: {} is swept twice", a.key));
    }
    axes.push_back(std::move(a));
  }
  return axes;
}

std::vector<SweepPoint> sweepPoints(const std::vector<SweepAxis>& axes) {
  std::vector<SweepPoint> points(1);
  for (const auto& axis : axes) {
    std::vector<SweepPoint> next;
    for (const auto& p : points) {
      for (const auto& v : axis.values) {
        SweepPoint q = p;
        q.overrides.push_back(axis.key + "=" + v);
        q.label += (q.label.empty() ? "" : ",") + labelPart(axis.key, v);
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  return points;
}

}  // namespace cohort::cluster
