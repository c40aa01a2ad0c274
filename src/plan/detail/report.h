#pragma once

// What `cohort plan` prints: a table for people, JSON for scripts (and for
// `cohort run --plan`, which puts the prediction beside the measured
// figures in summary.json).

#include <nlohmann/json.hpp>

#include <ostream>
#include <string>
#include <vector>

#include "cohort/plan/plan.h"

namespace cohort::plan::detail {

struct Row {
  Setting setting;
  MemoryEstimate memory;
  SpeedEstimate speed;
  CostEstimate cost;
};

Row predictRow(const Fit& fit, const JobConfig& job, const Setting& s, double limitMb, double price);

struct Report {
  std::string jobPath, jobName, cpu;
  int64_t cores = 0;               // per node, as planned
  double limitMb = 0;              // per rank; 0: none known
  std::string limitSource;
  double pricePerNodeHour = 0;
  Fit fit;
  Row target;                      // the job's setting at --nodes x --procs-per-node
  std::vector<Row> byNodes;        // the same at other node counts
  std::vector<Row> alternatives;   // settings that fit, when the target does not
  int probes = 0;
  double probeSeconds = 0;
};

nlohmann::json reportJson(const Report& r);
void printReport(const Report& r, std::ostream& out);

// The JSON of one row (also what the tuner's table holds).
nlohmann::json rowJson(const Row& row);

}  // namespace cohort::plan::detail
