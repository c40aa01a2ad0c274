// `cohort submit --slurm` against a real Slurm (util/slurm.h): a job runs to
// the end on one node and across two, a requeue mid-run resumes from the
// checkpoint to the same weights as an uninterrupted run, the time limit's
// warning makes the ranks checkpoint and the job exit 75, a sweep is a job
// array of run directories, a node taken down mid-job ends in a requeue and
// completion, a pending job is tracked and cancelled by its run directory,
// and Slurm's refusal submits nothing. Elastic (one `cohort agent` per
// node): the agents go on without a node whose agent is killed, SIGUSR2
// stops the job with a checkpoint that slurm.conf's RequeueExit=75 requeues
// with no scontrol on the node, and a pipelined job requeued onto fewer
// nodes resumes on the layout they hold.

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/ckpt/state_dict.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/runs.h"
#include "util/slurm.h"
#include "util/skip.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

nlohmann::json summaryOf(const std::string& run) {
  std::error_code ec;
  if (!fs::exists(run + "/summary.json", ec)) return nlohmann::json::object();
  auto j = nlohmann::json::parse(test::readText(run + "/summary.json"), nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

bool completed(const std::string& run) { return summaryOf(run).value("status", "") == "completed"; }

// The newest committed checkpoint step under run/checkpoints (-1: none).
int64_t newestCheckpoint(const std::string& run) {
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && fs::exists(e.path() / "manifest.json", ec)) {
      newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
    }
  }
  return newest;
}

// The tiny job, `epochs` epochs of 12 steps, a checkpoint every 3 steps.
std::string tinyJob(const test::TempDir& dir, int epochs) {
  const std::string path = dir.file("job.yaml");
  test::writeText(path, test::tinyJobYaml("tiny") + "checkpoint:\n  every_steps: 3\n  when_behind: wait\n");
  std::string yaml = test::readText(path);
  const auto at = yaml.find("  epochs: 1");
  yaml.replace(at, 11, "  epochs: " + std::to_string(epochs));
  test::writeText(path, yaml);
  return path;
}

// Each test makes its directory before its cluster, so that the cluster (and
// any job still writing there) is gone before the directory is removed,
// even when a test ends early.
class SlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = test::SlurmCluster::unavailable(nodes());
    if (!why.empty()) COHORT_SKIP(why);
  }
  virtual int nodes() const { return 1; }

  // `cohort submit JOB --slurm args...` against `cluster`; the Slurm job id.
  std::string submit(const test::SlurmCluster& cluster, const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& extraEnv = {}) {
    auto env = cluster.env();
    env.insert(extraEnv.begin(), extraEnv.end());
    std::vector<std::string> argv{"submit"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--slurm");
    const auto r = test::cohort(argv, env, 2min);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    const auto at = r.out.find("submitted Slurm job ");
    if (at == std::string::npos) return "";
    std::string rest = r.out.substr(at + 20);
    if (rest.rfind("array ", 0) == 0) rest = rest.substr(6);
    return rest.substr(0, rest.find_first_of(" \n"));
  }

  // A 3-epoch job with --requeue, slowed so that it still runs once its
  // checkpoint of step 6 is committed; returns the job id then ("" if not).
  std::string submitRequeueable(const test::SlurmCluster& cluster, const std::string& job, const std::string& run) {
    const std::string id = submit(cluster, {job, "--run-dir", run, "--requeue"},
                                  {{"COHORT_FAULT", "slow250@rank0:step1:always"}});
    if (id.empty() || !test::waitUntil([&] { return newestCheckpoint(run) >= 6; }, 120s)) {
      ADD_FAILURE() << "no checkpoint of step 6: " << cluster.showJob(id);
      return "";
    }
    return id;
  }

  // The job was requeued once, ran to the end and resumed from step
  // `fromStep` or later.
  void expectCompletedAfterOneRequeue(const test::SlurmCluster& cluster, const std::string& id,
                                      const std::string& run, int64_t fromStep = 6) {
    ASSERT_TRUE(test::waitUntil([&] { return completed(run); }, 240s))
        << cluster.showJob(id) << test::readText(run + "/slurm-" + id + ".out");
    EXPECT_EQ(cluster.jobField(id, "Restarts"), "1") << cluster.showJob(id);
    const auto summary = summaryOf(run);
    ASSERT_TRUE(summary.contains("resumed_from")) << summary.dump();
    EXPECT_GE(summary["resumed_from"].value("step", 0), fromStep) << summary.dump();
  }

  // Waits until Slurm forgets nothing of the job's running: a final state.
  std::string finalState(const test::SlurmCluster& cluster, const std::string& id, std::chrono::seconds limit) {
    std::string state;
    test::waitUntil(
        [&] {
          state = cluster.jobField(id, "JobState");
          return state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT" ||
                 state == "NODE_FAIL";
        },
        limit);
    return state;
  }
};

TEST_F(SlurmTest, OneNodeRunsToTheEndAndIsTrackedByItsRunDirectory) {
  test::TempDir dir;
  test::SlurmCluster cluster(1);
  const std::string job = tinyJob(dir, 1);
  const std::string run = dir.file("run");
  const std::string id = submit(cluster, {job, "--run-dir", run, "--set", "distribution.procs_per_node=2"});
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(finalState(cluster, id, 180s), "COMPLETED") << cluster.showJob(id) << test::readText(run + "/slurm-" + id + ".out");
  const auto summary = summaryOf(run);
  EXPECT_EQ(summary.value("status", ""), "completed") << summary.dump();
  EXPECT_EQ(summary.value("world_size", 0), 2);
  // srun's ranks wait as cohort run's do (the script's GOMP_SPINCOUNT),
  // unless this environment sets a wait policy of its own.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr) {
    EXPECT_EQ(summary["compute"].value("openmp_wait", ""), "GOMP_SPINCOUNT=10000") << summary.dump();
  }
  EXPECT_TRUE(has(test::readText(run + "/logs/rank-1.log"), "rank 1/2 started by slurm"));
  // status, runs and logs find the job from the run directory alone.
  const auto status = test::cohort({"status", run}, cluster.env());
  ASSERT_EQ(status.exitCode, 0) << status.describe();
  EXPECT_TRUE(has(status.out, "state       completed")) << status.out;
  EXPECT_TRUE(has(status.out, "slurm       job " + id + ": COMPLETED")) << status.out;
  const auto runs = test::cohort({"runs", dir.path()}, cluster.env());
  EXPECT_TRUE(has(runs.out, "completed")) << runs.out;
  EXPECT_TRUE(has(runs.out, " " + id)) << runs.out;
  const auto logs = test::cohort({"logs", run, "--rank", "1"}, cluster.env());
  EXPECT_EQ(logs.exitCode, 0) << logs.describe();
  EXPECT_TRUE(has(logs.out, "[rank 1/2]")) << logs.out;
}

TEST_F(SlurmTest, ARefusedJobLeavesNothing) {
  test::TempDir dir;
  test::SlurmCluster cluster(1);
  const std::string job = tinyJob(dir, 1);
  auto r = test::cohort({"submit", job, "--slurm", "--run-dir", dir.file("run"), "--partition", "nosuch"},
                        cluster.env());
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_TRUE(has(r.err, "Slurm refused the job")) << r.err;
  EXPECT_TRUE(has(r.err, "nosuch") || has(r.err, "partition")) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("run")));
  r = test::cohort({"submit", job, "--slurm", "--run-dir", dir.file("run"), "--time", "soon"}, cluster.env());
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_TRUE(has(r.err, "Slurm refused the job")) << r.err;
  EXPECT_TRUE(has(r.err, "time")) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("run")));
  EXPECT_TRUE(cluster.client({"/usr/bin/squeue", "-h"}).out.empty());
}

TEST_F(SlurmTest, APendingJobIsTrackedAndCancelledByItsRunDirectory) {
  test::TempDir dir;
  test::SlurmCluster cluster(1);
  const std::string job = tinyJob(dir, 1);
  const std::string run = dir.file("run");
  // The only node drained: the job waits.
  ASSERT_EQ(cluster.client({"/usr/bin/scontrol", "update", "nodename=n1", "state=drain", "reason=cohort-test"}).exitCode,
            0);
  const std::string id = submit(cluster, {job, "--run-dir", run});
  ASSERT_FALSE(id.empty());
  const auto status = test::cohort({"status", run}, cluster.env());
  ASSERT_EQ(status.exitCode, 0) << status.describe();
  EXPECT_TRUE(has(status.out, "state       pending")) << status.out;
  const auto logs = test::cohort({"logs", run}, cluster.env());
  EXPECT_EQ(logs.exitCode, 2) << logs.describe();
  EXPECT_TRUE(has(logs.err, "its Slurm job " + id + " is PENDING")) << logs.err;
  const auto cancel = test::cohort({"cancel", run}, cluster.env());
  ASSERT_EQ(cancel.exitCode, 0) << cancel.describe();
  EXPECT_TRUE(has(cancel.out, "cancelled Slurm job " + id)) << cancel.out;
  EXPECT_EQ(finalState(cluster, id, 30s), "CANCELLED") << cluster.showJob(id);
  const auto after = test::cohort({"runs", dir.path()}, cluster.env());
  EXPECT_TRUE(has(after.out, "cancelled")) << after.out;
}

TEST_F(SlurmTest, ARequeueMidRunResumesToTheWeightsOfAnUninterruptedRun) {
  test::TempDir dir;
  test::SlurmCluster cluster(1);
  const std::string job = tinyJob(dir, 3);
  const std::string run = dir.file("run");
  const std::string id = submitRequeueable(cluster, job, run);
  ASSERT_FALSE(id.empty());
  auto r = cluster.client({"/usr/bin/scontrol", "requeue", id});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  expectCompletedAfterOneRequeue(cluster, id, run);
  // The same job under `cohort run`, never interrupted.
  const auto straight = test::cohort({"run", job, "--run-dir", dir.file("straight")});
  ASSERT_EQ(straight.exitCode, 0) << straight.describe();
  const auto a = ckpt::readStateDict(run + "/model/final.pt");
  const auto b = ckpt::readStateDict(dir.file("straight/model/final.pt"));
  EXPECT_EQ(test::maxDifference(a, b), 0.0);
}

TEST_F(SlurmTest, TheTimeLimitsWarningCheckpointsAndExits75) {
  test::TempDir dir;
  test::SlurmCluster cluster(1);
  const std::string job = tinyJob(dir, 20);
  const std::string run = dir.file("run");
  // One minute, SIGUSR2 at most 50 s before it (Slurm checks about every
  // 30 s, so it comes 10-40 s in); the slow forward makes the job need far
  // more than a minute.
  const std::string id = submit(cluster, {job, "--run-dir", run, "--time", "1", "--signal-seconds", "50"},
                                {{"COHORT_FAULT", "slow300@rank0:step1:always"}});
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(finalState(cluster, id, 150s), "FAILED") << cluster.showJob(id);
  EXPECT_EQ(cluster.jobField(id, "ExitCode"), "75:0") << cluster.showJob(id);
  const std::string log = test::readText(run + "/logs/rank-0.log");
  EXPECT_TRUE(has(log, "received SIGUSR2 (the time limit is near)")) << log;
  EXPECT_EQ(summaryOf(run).value("status", ""), "stopped");
  EXPECT_GE(newestCheckpoint(run), 1);
  EXPECT_EQ(newestCheckpoint(run), summaryOf(run).value("steps", -2)) << summaryOf(run).dump();
}

// What a user of --time with --requeue sees: a job that needs more than its
// time limit stops at each warning with a checkpoint, is requeued, and
// completes across its starts, whenever in a start the warning comes
// (Slurm may send it up to 60 s early: at the very start of a start).
TEST_F(SlurmTest, ATimeLimitedRequeueableJobCompletesAcrossItsWarnings) {
  test::TempDir dir;
  test::SlurmCluster cluster(1);
  const std::string job = tinyJob(dir, 8);  // 96 steps
  const std::string run = dir.file("run");
  const std::string id = submit(cluster, {job, "--run-dir", run, "--time", "1", "--signal-seconds", "50", "--requeue"},
                                {{"COHORT_FAULT", "slow500@rank0:step1:always"}});
  ASSERT_FALSE(id.empty());
  // 96 steps of 0.5 s: more than one start's minute.
  ASSERT_TRUE(test::waitUntil([&] { return completed(run); }, 420s))
      << cluster.showJob(id) << test::readText(run + "/slurm-" + id + ".out");
  EXPECT_GE(std::stoi(cluster.jobField(id, "Restarts")), 1) << cluster.showJob(id);
  EXPECT_EQ(summaryOf(run).value("steps", 0), 96);
  const std::string out = test::readText(run + "/slurm-" + id + ".out");
  EXPECT_TRUE(has(out, "cohort: stopped after a checkpoint")) << out;
  EXPECT_FALSE(has(out, "restart 1 of")) << out;
}

// The time limit's warning at moments of the ranks' start: after a requeue
// Slurm may send it a second after the job starts again (it checks every
// 30 s and may signal up to 60 s early). `batch`: to the batch script, as
// --signal=B:USR2 sends it (the script passes it to srun); otherwise to the
// step, as `scancel --signal=USR2` does. The ranks pause at the moment named
// (COHORT_TEST_PAUSE) until the signal has reached them.
struct Warning {
  const char* point;
  bool batch;
};

void PrintTo(const Warning& w, std::ostream* os) { *os << w.point << (w.batch ? " (to the batch script)" : " (to the step)"); }

class SlurmWarningWhileStarting : public SlurmTest, public ::testing::WithParamInterface<Warning> {};

TEST_P(SlurmWarningWhileStarting, TheJobStopsAfterACheckpointIsRequeuedAndCompletes) {
  const Warning w = GetParam();
  test::TempDir dir;
  test::SlurmCluster cluster(1);
  const std::string job = tinyJob(dir, 1);
  const std::string run = dir.file("run");
  const std::string pause = dir.file("pause");
  fs::create_directories(pause);
  const std::string id = submit(cluster, {job, "--run-dir", run, "--requeue", "--set", "distribution.procs_per_node=2"},
                                {{"COHORT_TEST_PAUSE", std::string(w.point) + ":" + pause}});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(test::waitUntil([&] { return test::pausedAt(pause, w.point).size() == 2; }, 120s))
      << cluster.showJob(id);
  std::vector<std::string> scancel{"/usr/bin/scancel", "--signal=USR2"};
  if (w.batch) scancel.push_back("--batch");
  scancel.push_back(id);
  ASSERT_EQ(cluster.client(scancel).exitCode, 0);
  // Slurm delivers it after scancel returns: wait until both ranks have it,
  // pending (no signal thread yet) or taken (logged).
  const std::string out = run + "/slurm-" + id + ".out";
  const auto ranks = test::pausedAt(pause, w.point);
  ASSERT_TRUE(test::waitUntil(
      [&] {
        int got = 0;
        for (pid_t pid : ranks) got += test::signalPending(pid, SIGUSR2);
        const std::string text = test::readText(out);
        for (size_t at = 0; (at = text.find("received SIGUSR2", at)) != std::string::npos; ++at) ++got;
        return got >= 2;
      },
      60s))
      << test::readText(out);
  // Before its signal thread a rank holds the signal, blocked since its
  // first instruction, instead of dying of it (srun's exit 140).
  if (std::string(w.point) == "start") {
    for (pid_t pid : ranks) EXPECT_TRUE(test::signalPending(pid, SIGUSR2)) << pid;
  }
  test::writeText(pause + "/" + w.point + ".go", "");
  expectCompletedAfterOneRequeue(cluster, id, run, 1);
  const std::string text = test::readText(out);
  EXPECT_TRUE(has(text, "while starting: training stops after its first steps")) << text;
  EXPECT_TRUE(has(text, "cohort: stopped after a checkpoint")) << text;
  EXPECT_FALSE(has(text, "restart 1 of")) << text;
}

INSTANTIATE_TEST_SUITE_P(Moments, SlurmWarningWhileStarting,
                         ::testing::Values(Warning{"start", true}, Warning{"rendezvous", false},
                                           Warning{"model", true}),
                         [](const auto& info) { return std::string(info.param.point); });

TEST_F(SlurmTest, ASweepIsAJobArrayOfRunDirectories) {
  test::TempDir dir;
  test::SlurmCluster cluster(1);
  const std::string job = tinyJob(dir, 1);
  const std::string sweep = dir.file("sweep");
  const std::string id = submit(cluster, {job, "--run-dir", sweep, "--sweep", "training.optimizer.lr=0.02,0.05,0.1"});
  ASSERT_FALSE(id.empty());
  const std::vector<std::string> runs = {sweep + "/0-lr=0.02", sweep + "/1-lr=0.05", sweep + "/2-lr=0.1"};
  ASSERT_TRUE(test::waitUntil([&] { return completed(runs[0]) && completed(runs[1]) && completed(runs[2]); }, 240s))
      << cluster.client({"/usr/bin/squeue", "-t", "all"}).out;
  EXPECT_TRUE(has(test::readText(runs[2] + "/job.yaml"), "lr: 0.1"));
  // A task's run directory is complete a moment before Slurm records the
  // task as ended (its step still exiting): wait for Slurm's word, bounded.
  auto completedTasks = [](const std::string& out) {
    size_t done = 0;
    for (size_t at = 0; (at = out.find("completed", at)) != std::string::npos; at += 9) ++done;
    return done;
  };
  test::ProcessResult list;
  ASSERT_TRUE(test::waitUntil(
      [&] {
        list = test::cohort({"runs", sweep}, cluster.env());
        return list.exitCode != 0 || completedTasks(list.out) == 3;
      },
      60s))
      << list.out;
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(has(list.out, id + "_" + std::to_string(i))) << list.out;
  EXPECT_EQ(completedTasks(list.out), 3u) << list.out;
  // Different learning rates, different weights.
  EXPECT_GT(test::maxDifference(ckpt::readStateDict(runs[0] + "/model/final.pt"),
                                ckpt::readStateDict(runs[2] + "/model/final.pt")),
            0.0);
}

TEST_F(SlurmTest, ElasticStopsWithACheckpointThatRequeueExitRequeuesWithoutScontrol) {
  test::TempDir dir;
  test::SlurmCluster cluster(1, "RequeueExit=75");
  const std::string job = tinyJob(dir, 3);
  const std::string run = dir.file("run");
  // The job's PATH holds srun, not scontrol: as in a container without it.
  const std::string bin = dir.file("bin");
  fs::create_directories(bin);
  for (const char* tool : {"sbatch", "srun"}) fs::create_symlink(std::string("/usr/bin/") + tool, bin + "/" + tool);
  const std::string id = submit(cluster, {job, "--run-dir", run, "--requeue", "--nodes", "1:1", "--set",
                                          "distribution.procs_per_node=2"},
                                {{"COHORT_FAULT", "slow250@rank0:step1:always"}, {"PATH", bin}});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(test::waitUntil([&] { return newestCheckpoint(run) >= 3; }, 120s))
      << cluster.showJob(id) << test::readText(run + "/slurm-" + id + ".out");
  // What Slurm sends before the time limit, or on preemption.
  ASSERT_EQ(cluster.client({"/usr/bin/scancel", "--signal=USR2", id}).exitCode, 0);
  expectCompletedAfterOneRequeue(cluster, id, run, 3);
  const std::string out = test::readText(run + "/slurm-" + id + ".out");
  EXPECT_TRUE(has(out, "no scontrol on this node")) << out;
  EXPECT_TRUE(has(out, "received SIGUSR2")) << out;
  EXPECT_TRUE(has(out, "the job stops")) << out;
  EXPECT_EQ(summaryOf(run).value("world_size", 0), 2);
}

class SlurmTwoNodes : public SlurmTest {
 protected:
  int nodes() const override { return 2; }
};

TEST_F(SlurmTwoNodes, TwoNodesTrainAsCohortRunDoes) {
  test::TempDir dir;
  test::SlurmCluster cluster(2);
  const std::string job = tinyJob(dir, 1);
  const std::string run = dir.file("run");
  const std::string id = submit(cluster, {job, "--run-dir", run, "--nodes", "2"});
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(finalState(cluster, id, 180s), "COMPLETED") << cluster.showJob(id) << test::readText(run + "/slurm-" + id + ".out");
  EXPECT_EQ(cluster.jobField(id, "NodeList"), "n[1-2]");
  EXPECT_EQ(summaryOf(run).value("world_size", 0), 2);
  const auto local = test::cohort({"run", job, "--run-dir", dir.file("local"), "--procs", "2"});
  ASSERT_EQ(local.exitCode, 0) << local.describe();
  EXPECT_LT(test::maxDifference(ckpt::readStateDict(run + "/model/final.pt"),
                                ckpt::readStateDict(dir.file("local/model/final.pt"))),
            1e-6);
}

TEST_F(SlurmTwoNodes, ANodeTakenDownMidJobEndsInARequeueAndCompletion) {
  test::TempDir dir;
  test::SlurmCluster cluster(2);
  const std::string job = tinyJob(dir, 3);
  const std::string run = dir.file("run");
  const std::string id = submitRequeueable(cluster, job, run);
  ASSERT_FALSE(id.empty());
  const std::string node = cluster.jobField(id, "NodeList");
  ASSERT_TRUE(node == "n1" || node == "n2") << cluster.showJob(id);
  auto r = cluster.client({"/usr/bin/scontrol", "update", "nodename=" + node, "state=down", "reason=cohort-test"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  expectCompletedAfterOneRequeue(cluster, id, run);
  EXPECT_NE(cluster.jobField(id, "NodeList"), node) << cluster.showJob(id);
}

// The agents on the nodes of a MIN:MAX job: one is killed mid-run (its
// process, as a node's failure ends it), and the other re-forms alone and
// completes the job; the script reports it so.
TEST_F(SlurmTwoNodes, ElasticAgentsGoOnWithoutANodeThatFails) {
  test::TempDir dir;
  test::SlurmCluster cluster(2);
  const std::string job = tinyJob(dir, 3);
  const std::string run = dir.file("run");
  const std::string id = submit(cluster, {job, "--run-dir", run, "--nodes", "1:2"},
                                {{"COHORT_FAULT", "slow250@rank0:step1:always"}});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(test::waitUntil([&] { return newestCheckpoint(run) >= 3; }, 120s))
      << cluster.showJob(id) << test::readText(run + "/slurm-" + id + ".out");
  EXPECT_EQ(cluster.jobField(id, "NodeList"), "n[1-2]") << cluster.showJob(id);
  // The agent of n2 (not the batch host's, which hosts the rendezvous); its
  // node id, in its log's name, ends in its pid.
  pid_t victim = 0;
  std::string survivorLog;
  for (const auto& e : fs::directory_iterator(run + "/logs")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("agent-", 0) != 0) continue;
    const pid_t pid = std::stoi(name.substr(name.rfind('-') + 1, name.size() - 4 - name.rfind('-') - 1));
    if (cluster.runsOn(pid, 1)) {
      victim = pid;
    } else {
      survivorLog = e.path().string();
    }
  }
  ASSERT_GT(victim, 0) << test::readText(run + "/slurm-" + id + ".out");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  EXPECT_EQ(finalState(cluster, id, 180s), "COMPLETED") << cluster.showJob(id) << test::readText(run + "/slurm-" + id + ".out");
  EXPECT_EQ(summaryOf(run).value("status", ""), "completed") << summaryOf(run).dump();
  const std::string log = test::readText(survivorLog);
  // Its next round, without the other (seen lost, or its rank's
  // connections reset).
  EXPECT_TRUE(has(log, "round 1: node 0 of 1")) << log;
  EXPECT_TRUE(has(test::readText(run + "/slurm-" + id + ".out"), "completed on the others"));
  // A killed node cannot clear its state from memory (elastic.state_dir,
  // /dev/shm): the test clears the victim's.
  const std::string prefix = "cohort-slurm-" + id + "-", suffix = "-" + std::to_string(victim);
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      fs::remove_all(e.path());
    }
  }
}

// A pipelined GPT (2 stages on each node's 2 ranks) submitted for 1 to 2
// nodes with --requeue runs as 2 replicas on both; n2 is drained and the
// job requeued: it gets n1 alone and resumes from its checkpoint in the
// layout one node holds, 1 replica of the 2 stages.
TEST_F(SlurmTwoNodes, ARequeuedPipelineOnFewerNodesResumesOnTheNewLayout) {
  test::TempDir dir;
  test::SlurmCluster cluster(2);
  test::writeText(dir.file("corpus.txt"), test::corpus(40'000));
  const auto tok = test::cohort({"data", "tokenize", dir.file("corpus.txt"), dir.file("tok"), "--no-progress"});
  ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  const std::string job = dir.file("gpt.yaml");
  std::string yaml = test::tinyGptYaml("gpt", dir.file("tok/train"), 4);
  yaml.replace(yaml.find("  max_steps: 6\n"), 15, "  max_steps: 24\n");
  test::writeText(job, yaml + "checkpoint: {every_steps: 3, when_behind: wait}\n");
  const std::string run = dir.file("run");
  const std::string id = submit(cluster,
                                {job, "--run-dir", run, "--nodes", "1:2", "--requeue", "--set",
                                 "distribution.procs_per_node=2", "--set", "distribution.pipeline.stages=2", "--set",
                                 "training.batch_size=2"},
                                {{"COHORT_FAULT", "slow100@rank0:step1:always"}});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(test::waitUntil([&] { return newestCheckpoint(run) >= 3; }, 120s))
      << cluster.showJob(id) << test::readText(run + "/slurm-" + id + ".out");
  ASSERT_EQ(cluster.jobField(id, "NodeList"), "n[1-2]") << cluster.showJob(id);
  // n2 takes no new job (drained) and the job is requeued: it starts again
  // on n1 alone.
  auto r = cluster.client({"/usr/bin/scontrol", "update", "nodename=n2", "state=drain", "reason=cohort-test"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  r = cluster.client({"/usr/bin/scontrol", "requeue", id});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  ASSERT_TRUE(test::waitUntil([&] { return completed(run); }, 240s))
      << cluster.showJob(id) << test::readText(run + "/slurm-" + id + ".out");
  EXPECT_EQ(cluster.jobField(id, "Restarts"), "1") << cluster.showJob(id);
  EXPECT_EQ(cluster.jobField(id, "NodeList"), "n1") << cluster.showJob(id);
  const auto summary = summaryOf(run);
  ASSERT_TRUE(summary.contains("resumed_from")) << summary.dump();
  EXPECT_GE(summary["resumed_from"].value("step", 0), 3) << summary.dump();
  EXPECT_EQ(summary.value("world_size", 0), 2) << summary.dump();
  const std::string log = test::readText(run + "/logs/rank-0.log");
  EXPECT_TRUE(has(log, "mesh: 2 data replicas x 2 pipeline stages")) << log;
  EXPECT_TRUE(has(log, "this round's 2 ranks: 1 data replica x 2 pipeline stages x 1 tensor rank")) << log;
}

}  // namespace
}  // namespace cohort
