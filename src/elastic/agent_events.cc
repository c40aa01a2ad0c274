#include "elastic/detail/agent_events.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cohort/ckpt/manifest.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"

namespace cohort::elastic::detail {

AgentEvents::AgentEvents(const RunDir& runDir, const std::string& node)
    : runDir_(runDir), node_(node), path_(runDir.root + "/events/agent-" + node + ".jsonl") {
  std::error_code ec;
  std::filesystem::create_directories(runDir.root + "/events", ec);
}

void AgentEvents::add(nlohmann::json event) {
  event["time"] = ckpt::utcNow();
  event["node"] = node_;
  std::ofstream out(path_, std::ios::app);
  out << event.dump() << "\n";
  if (!out) log::warn("cannot append to {}", path_);
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
