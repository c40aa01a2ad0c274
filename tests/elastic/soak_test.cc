// A soak of elastic training driven by a schedule file
// (tests/elastic/soak-schedule.txt: which node joins, leaves or is killed at
// which step; 11 changes): real agents on etcd, the job must complete with
// every sample of every epoch trained on exactly once and no step redone.

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "elastic/elastic_util.h"
#include "util/etcd.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/skip.h"

namespace cohort::test {
namespace {

using namespace std::chrono_literals;

struct Change {
  int64_t step;
  std::string action, node;
};

std::vector<Change> readSchedule(const std::string& path) {
  std::vector<Change> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    Change c;
    if (ss >> c.step >> c.action >> c.node) out.push_back(c);
  }
  return out;
}

TEST(ElasticSoak, ElevenChangesFromAScheduleFile) {
  if (etcdBinary().empty()) COHORT_SKIP("etcd is not installed (scripts/install-deps.sh)");
  const auto schedule = readSchedule(sourceDir() + "/tests/elastic/soak-schedule.txt");
  ASSERT_GE(schedule.size(), 10u);
  TempDir dir;
  std::filesystem::create_directories(dir.file("samples"));
  std::filesystem::create_directories(dir.file("shm"));
  const std::string job = dir.file("job.yaml");
  writeText(job, elasticJobYaml(dir.file("runs"), 6, "  state_dir: " + dir.file("shm") + "\n"));
  EtcdCluster etcd(1);
  const auto env = elasticEnv(dir.file("samples"), 8);
  std::map<std::string, std::unique_ptr<Process>> nodes;
  auto start = [&](const std::string& node) {
    nodes[node] = startAgent(AgentSpec{node, "etcd://" + etcd.endpoints() + "/soak", "2:4", job,
                                       dir.file("run"), {}, {}},
                             env);
  };
  auto steps = [&] { return readSampleLog(dir.file("samples")).lastStep; };
  start("n0");
  start("n1");
  for (const Change& c : schedule) {
    if (!waitUntil([&] { return steps() >= c.step; }, 120s)) {
      std::string logs;
      for (auto& [node, p] : nodes) {
        const std::string err = p->stderrSoFar();
        logs += "\n--- " + node + ":\n" + err.substr(err.size() > 3000 ? err.size() - 3000 : 0);
      }
      FAIL() << "step " << c.step << " never came (at " << steps() << ")" << logs;
    }
    if (c.action == "join") {
      start(c.node);
    } else if (c.action == "leave") {
      nodes.at(c.node)->signal(SIGTERM);
      const ProcessResult r = nodes.at(c.node)->wait(60s);
      EXPECT_EQ(r.exitCode, 0) << c.node << ": " << r.describe();
      nodes.erase(c.node);
    } else if (c.action == "kill") {
      Process& p = *nodes.at(c.node);
      for (pid_t rank : childrenOf(p.pid())) ::kill(rank, SIGKILL);
      p.signal(SIGKILL);
      (void)p.wait(10s);
      nodes.erase(c.node);
    } else {
      FAIL() << "unknown action " << c.action;
    }
  }
  for (auto& [node, p] : nodes) {
    const ProcessResult r = p->wait(4min);
    EXPECT_EQ(r.exitCode, 0) << node << ": " << r.describe();
  }
  if (const char* keep = std::getenv("COHORT_TEST_KEEP")) {
    std::filesystem::copy(dir.path(), keep, std::filesystem::copy_options::recursive);
  }
  const SampleHistory h = readSampleLog(dir.file("samples"));
  EXPECT_TRUE(h.redone().empty()) << h.redone().size() << " steps redone";
  // Changes close together may share a re-form (a node that joins while
  // one is under way is admitted with it).
  EXPECT_GE(h.stepsByRound.size(), schedule.size() / 2) << "changes made too few rounds";
  ASSERT_EQ(h.timesTrained.size(), 6u);
  for (const auto& [epoch, times] : h.timesTrained) {
    EXPECT_EQ(times.size(), 4096u) << "epoch " << epoch;
    for (const auto& [id, n] : times) ASSERT_EQ(n, 1) << "epoch " << epoch << " sample " << id;
  }
}

}  // namespace
}  // namespace cohort::test
