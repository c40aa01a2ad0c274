#pragma once

// A range of optimizer steps, as `cohort run --profile STEPS` and
// output.profile write it: "FIRST-LAST" (both included) or one step "N".
// Steps count from 1, as the logs and metrics.jsonl number them.

#include <cstdint>
#include <string>

namespace cohort {

struct StepRange {
  int64_t first = 0;
  int64_t last = 0;  // >= first

  int64_t count() const { return last - first + 1; }
  std::string describe() const;  // "20-22", or "20" for one step
};

// Parses "20-22" or "20" (spaces around the numbers allowed). Throws
// ConfigError without naming the option (the caller prefixes it) for an
// empty text, a missing bound ("-", "0-"), anything but digits ("abc"), a
// step below 1 or a reversed range ("22-20").
StepRange parseStepRange(const std::string& text);

}  // namespace cohort
