#pragma once

// A health report as JSON and back: what ranks exchange through the store
// and what `cohort health --json` prints (one element of its array).

#include <nlohmann/json.hpp>

#include <string>

#include "cohort/monitor/health.h"

namespace cohort::monitor::detail {

nlohmann::json toJson(const HealthReport& report);

// Throws cohort::Error quoting the text when it is not a report.
HealthReport reportFromJson(const std::string& text);

}  // namespace cohort::monitor::detail
