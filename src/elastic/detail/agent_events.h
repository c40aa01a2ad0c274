#pragma once

// What an agent records of an elastic job: every round, re-form, failure,
// join and leave, with the time each took, one JSON line per event in
// <run dir>/events/agent-<node>.jsonl; at the end, their counts over every
// agent in summary.json ("elastic").

#include <nlohmann/json.hpp>
#include <mutex>
#include <string>

#include "cohort/core/run_dir.h"

namespace cohort::elastic::detail {

class AgentEvents {
 public:
  AgentEvents(const RunDir& runDir, const std::string& node);
  // Adds "time" (UTC) and "node", and appends the line.
  void add(nlohmann::json event);
  // This node's counts for Prometheus (output.metrics_port): rounds,
  // re-forms, failures, the current round's size and this node's place,
  // the last rendezvous time. Safe from another thread.
  std::string render() const;
  // Adds "elastic" to summary.json (written by rank 0 when training ended):
  // rounds, re-forms, failures, nodes that left, from every agent's file.
  void writeSummary() const;

 private:
  RunDir runDir_;
  std::string node_;
  std::string path_;
  mutable std::mutex mutex_;
  int64_t rounds_ = 0, reforms_ = 0, failures_ = 0, nodes_ = 0, nodeRank_ = -1;
  double rendezvousS_ = 0;
};

}  // namespace cohort::elastic::detail
