#pragma once

// A health report as JSON and back: what ranks exchange through the store
// and what `cohort health --json` prints (one element of its array).

#include <nlohmann/json.hpp>

#include <string>

#include "cohort/health/health.h"

namespace cohort::health::detail {

nlohmann::json toJson(const HealthReport& report);

// Throws cohort::Error quoting the text when it is not a report.
HealthReport reportFromJson(const std::string& text);

}  // namespace cohort::health::detail
