#pragma once

// Shared by the elastic tests: a job that trains long enough to resize
// (synthetic data, a forward slowed by COHORT_FAULT), agents as real
// processes, and the sample log (COHORT_TEST_SAMPLE_LOG) read back.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "util/process.h"

namespace cohort::test {

// Why tests across network-namespace hosts with etcd cannot run here
// (util/netns.h, util/etcd.h); "" when they can.
std::string multiHostUnavailable();

// 4096 synthetic samples, batch 8, `epochs` epochs, checkpoints every 100
// steps; elastic timings short (last call 1 s, nodes lost after 3 s).
// `extra`: further YAML lines appended (top-level keys).
std::string elasticJobYaml(const std::string& runsDir, int epochs, const std::string& extra = "");

// A GPT of `layers` blocks on the token shards at `tokens` (`cohort data
// tokenize`), `epochs` epochs of micro-batches of 2, the elastic timings of
// elasticJobYaml; `distribution`: the lines of that section (indented).
std::string elasticGptJobYaml(const std::string& runsDir, const std::string& tokens, int layers, int epochs,
                              const std::string& distribution);

struct AgentSpec {
  std::string node;
  std::string rdzv;    // with the job id
  std::string nnodes;  // "MIN:MAX"
  std::string job;     // path
  std::string runDir;
  std::vector<std::string> prefix;  // e.g. {"ip", "netns", "exec", "ns0"}
  std::vector<std::string> extraArgs;
};

// The environment every elastic test's agents get: the sample log, a slow
// forward on rank 0 (`slowMs` per step; 0: none), elastic.state_dir in
// `stateDir`.
std::map<std::string, std::string> elasticEnv(const std::string& samplesDir, int slowMs);

std::unique_ptr<Process> startAgent(const AgentSpec& a, const std::map<std::string, std::string>& env);

// What the sample log says (train/detail/faults.h, SampleLog). The state
// a round went on from ends at the step before the next round's first one:
// a step applied in a round and at or after that point was lost (done
// again); the samples of a step in progress when a round broke do not
// count (the step was never completed).
struct AppliedStep {
  int round = 0;
  int64_t unixMs = 0;   // when its first rank applied it
  int64_t samples = 0;  // trained in it, all ranks
};
struct SampleHistory {
  std::map<int, std::set<int64_t>> stepsByRound;          // round -> steps applied and kept
  std::map<int64_t, AppliedStep> applied;                  // step -> when and how much, kept steps
  std::map<int64_t, std::map<int64_t, int>> timesTrained;  // epoch -> sample -> times, over kept steps
  std::set<int64_t> lost;                                  // steps applied, then done again
  int64_t lastStep = 0;                                    // the last step applied and kept
  std::vector<int64_t> redone() const { return {lost.begin(), lost.end()}; }
};
SampleHistory readSampleLog(const std::string& dir);

// Exactly once: in the sample log at `dir`, `epochs` epochs, each of the
// `samples` samples of each trained on once, and no step applied twice
// (gtest expectations).
void expectExactlyOnce(const std::string& dir, int epochs, size_t samples = 4096);

// Waits for each of `agents` (at most `limit` after it started) and expects
// exit 0 (gtest expectations, with the agent's output). True when all did.
bool expectAllExitZero(const std::vector<std::unique_ptr<Process>>& agents, std::chrono::milliseconds limit);

// GET http://127.0.0.1:port/metrics: the body, or "" when nothing answers.
std::string scrapeMetrics(int port);

// Pids of the direct children of `pid` but its fork server: an agent's
// ranks.
std::vector<pid_t> childrenOf(pid_t pid);

}  // namespace cohort::test
