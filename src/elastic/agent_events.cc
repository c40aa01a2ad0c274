#include "elastic/detail/agent_events.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cohort/ckpt/manifest.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/monitor/prometheus.h"
#include "cohort/core/time.h"

namespace cohort::elastic::detail {

AgentEvents::AgentEvents(const RunDir& runDir, const std::string& node)
    : runDir_(runDir), node_(node), path_(runDir.root + "/events/agent-" + node + ".jsonl") {
  std::error_code ec;
  std::filesystem::create_directories(runDir.root + "/events", ec);
}

void AgentEvents::add(nlohmann::json event) {
  {
    std::lock_guard<std::mutex> g(mutex_);
    const std::string kind = event.value("event", "");
    if (kind == "round") {
      ++rounds_;
      nodes_ = event.value("nodes", int64_t{0});
      nodeRank_ = event.value("node_rank", int64_t{-1});
      rendezvousS_ = event.value("rendezvous_s", 0.0);
    }
    if (kind == "reform" || kind == "failure") ++reforms_;
    if (kind == "failure") ++failures_;
  }
  event["time"] = utcNow();
  event["node"] = node_;
  std::ofstream out(path_, std::ios::app);
  out << event.dump() << "\n";
  if (!out) log::warn("cannot append to {}", path_);
}

std::string AgentEvents::render() const {
  std::lock_guard<std::mutex> g(mutex_);
  const monitor::PrometheusText::Labels node = {{"node", node_}};
  return monitor::PrometheusText()
      .counter("cohort_elastic_rounds_total", "Rounds of the job this node took part in", double(rounds_), node)
      .counter("cohort_elastic_reforms_total", "Rounds this node saw end in a re-form (join, leave, loss, failure)",
               double(reforms_), node)
      .counter("cohort_elastic_failures_total", "Re-forms caused by a failure (counted against distribution.max_restarts)",
               double(failures_), node)
      .gauge("cohort_elastic_nodes", "Nodes in the current round", double(nodes_), node)
      .gauge("cohort_elastic_node_rank", "This node's rank in the current round", double(nodeRank_), node)
      .gauge("cohort_elastic_rendezvous_seconds", "How long the last rendezvous took", rendezvousS_, node)
      .str();
}

void AgentEvents::writeSummary() const {
  std::ifstream in(runDir_.summary());
  if (!in) return;
  nlohmann::json summary = nlohmann::json::parse(in, nullptr, false);
  if (!summary.is_object()) return;
  std::set<int64_t> rounds, reforms;
  int64_t failures = 0, leaves = 0;
  std::map<std::string, double> rendezvous;  // the slowest node's, per round
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(runDir_.root + "/events", ec)) {
    std::ifstream f(e.path());
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      const std::string kind = j.value("event", "");
      const int64_t round = j.value("round", int64_t{-1});
      if (kind == "round") rounds.insert(round);
      if (kind == "reform" || kind == "failure") reforms.insert(round);
      if (kind == "failure") ++failures;
      if (kind == "leave") ++leaves;
    }
  }
  summary["elastic"] = {{"rounds", rounds.size()},
                        {"reforms", reforms.size()},
                        {"failures", failures},
                        {"nodes_left", leaves}};
  writeFileAtomic(runDir_.summary(), summary.dump(2) + "\n");
}

}  // namespace cohort::elastic::detail
