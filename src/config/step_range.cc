#include "cohort/config/step_range.h"

#include <fmt/format.h>

#include <charconv>

#include "cohort/core/error.h"

namespace cohort {
namespace {

std::string trimmedSpaces(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// A step number of `text` (the whole range, for the message); -1 for what is none.
int64_t stepNumber(const std::string& part) {
  const std::string t = trimmedSpaces(part);
  int64_t v = -1;
  const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size()) return -1;
  return v;
}

}  // namespace

std::string StepRange::describe() const {
  return first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last);
}

StepRange parseStepRange(const std::string& text) {
  const std::string form = "expected FIRST-LAST (steps from 1, FIRST <= LAST, e.g. 20-22) or one step N";
  if (trimmedSpaces(text).empty()) throw ConfigError(fmt::format("an empty range of steps: {}", form));
  const size_t dash = text.find('-');
  StepRange r;
  r.first = stepNumber(text.substr(0, dash));
  r.last = dash == std::string::npos ? r.first : stepNumber(text.substr(dash + 1));
  if (r.first < 0 || r.last < 0) throw ConfigError(fmt::format("'{}' is not a range of steps: {}", text, form));
  if (r.first < 1) throw ConfigError(fmt::format("'{}': steps count from 1: {}", text, form));
  if (r.last < r.first) {
    throw ConfigError(fmt::format("'{}' is reversed: its last step comes before its first ({})", text, form));
  }
  return r;
}

}  // namespace cohort
