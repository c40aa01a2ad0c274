#pragma once

#include <string>
#include <vector>

namespace cohort::detail {

// The candidate closest to `word` by edit distance, or "" when none is close
// enough to be a plausible typo.
std::string closestMatch(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace cohort::detail
